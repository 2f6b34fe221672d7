"""Checks made on the driver before any worker starts, each failing with the cause named:
the world and its task tables, every image id of every table present in the image shards
(counted), the tokenizer, and the checkpoint against the family and vocabulary."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.parquet as pq

from vlp.contract.uri_files import open_input
from vlp.datasets.downstream import DownstreamDataConfig, DownstreamDataError, MissingImagesError
from vlp.datasets.downstream import data_config_for
from vlp.datasets.downstream.image_store import split_files
from vlp.datasets.stream.text_tokenizer import load_tokenizer
from vlp.datasets.storage.world import WorldError, load_manifest
from vlp.models import get_family
from vlp.models.factory import preprocess_spec
from vlp.platform.training import pretrained_weights as ckpt
from vlp.benchmarks import get_benchmark
from vlp.platform.finetune.finetune_config import FinetuneConfig

IMAGE_COLUMNS = {"vqa": ["image_id"], "retrieval": ["image_id"], "ve": ["image_id"],
                 "refexp": ["image_id"], "vcr": ["image_id"],
                 "nlvr2": ["image_id_left", "image_id_right"]}


@dataclass
class Prepared:
    data: DownstreamDataConfig
    family: object                 # FamilyConfig
    vocab_size: int
    checkpoint_step: int | None


def prepare(cfg: FinetuneConfig) -> Prepared:
    try:
        manifest = load_manifest(cfg.world)
    except WorldError as e:
        raise DownstreamDataError(str(e)) from None
    family = get_family(cfg.model.family)
    spec = preprocess_spec(family, ("itm",), manifest.feature_dim, manifest.num_classes)
    data = data_config_for(spec, cfg.world)
    if cfg.model.tokenizer:
        data = data.model_copy(update={"tokenizer_path": cfg.model.tokenizer})
    vocab = load_tokenizer(data.tokenizer_path).vocab_size
    if vocab != family.transformer.vocab_size and cfg.model.init == "minilm":
        raise DownstreamDataError(f"model.init minilm needs the packaged vocabulary, the "
                                  f"tokenizer {data.tokenizer_path} has {vocab} tokens")
    for name in cfg.benchmarks:
        check_images(data, get_benchmark(name).table, ["train", cfg.eval.split],
                     gt=name == "refcoco+-gt")
    step = None
    if cfg.model.init == "checkpoint":
        weights = ckpt.read(cfg.model.checkpoint)
        ckpt.check_fits(weights, family.name, manifest.feature_dim, vocab)
        for name in cfg.benchmarks:
            bench = get_benchmark(name)
            ckpt.check_type_rows(weights, family.name, bench.name, bench.token_types)
        step = weights.step
    return Prepared(data, family, vocab, step)


def check_images(data: DownstreamDataConfig, table: str, splits: list[str], gt: bool) -> None:
    """Every image id of the table's splits is in the split's image shards (ids only: cheap)."""
    manifest = load_manifest(data.world)
    for split in dict.fromkeys(splits):
        path = str(manifest.task_file(table, split))
        try:
            files = split_files(data, split, gt)
        except WorldError as e:
            raise DownstreamDataError(str(e)) from None
        have = set()
        for f in files:
            ids = pq.read_table(open_input(f), columns=["image_id"]).column("image_id")
            have.update(ids.to_pylist())
        t = pq.read_table(open_input(path), columns=IMAGE_COLUMNS[table])
        ids = [i for c in t.column_names for i in t.column(c).to_pylist()]
        missing = sorted(set(ids) - have)
        if missing:
            raise MissingImagesError(path, missing, len(set(ids)), files)


__all__ = ["Prepared", "prepare", "check_images"]
