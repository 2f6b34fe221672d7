"""UNITER's VCR second-stage pretraining with VCR's token types: captions "question [SEP]
answer [SEP] rationale" carry types 0 / 2 / 3, the model's table grows to 4 rows (new rows
copied from the text row), and the VCR finetune loads such a checkpoint into its table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline_world import C, D
from vlp.contract import batch_spec as K
from vlp.datasets.stream.data_config import DataConfig, DataConfigError, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches
from vlp.datasets.batching.segment_types import segment_type_ids
from vlp.datasets.storage.shards import image_table, write_image_shard
from vlp.datasets.stream.text_tokenizer import load_tokenizer
from vlp.models import create_model
from vlp.models.checkpoints import CheckpointError
from vlp.models.heads import extend_for
from vlp.platform.training import pretrained_weights as ckpt

torch.set_num_threads(1)
CLS, SEP, PAD = 101, 102, 0


def test_segment_type_ids_by_hand():
    ids = np.array([[CLS, 7, 8, SEP, 9, SEP, 10, 11, SEP, PAD],
                    [CLS, 7, SEP, PAD, PAD, PAD, PAD, PAD, PAD, PAD],
                    [CLS, 7, SEP, 8, SEP, 9, SEP, 10, SEP, PAD]])
    mask = (ids != PAD).astype(np.int64)
    got = segment_type_ids(ids, mask, SEP, (0, 2, 3))
    assert got.tolist() == [[0, 0, 0, 2, 2, 3, 3, 3, 3, 0],
                            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],    # one segment: the question's
                            [0, 0, 2, 2, 3, 3, 3, 3, 3, 0]]    # a 4th segment keeps the last
    with pytest.raises(DataConfigError, match="text_segment_types"):
        DataConfig(sources=(SourceConfig("a", "a"),), text_segment_types=(0, -2))


@pytest.fixture(scope="module")
def vcr_source(tmp_path_factory):
    d = tmp_path_factory.mktemp("vcr_pretrain")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):
        n = 12
        boxes = np.tile([[0.0, 0.0, 20.0, 20.0]], (n, 1)) + rng.uniform(0, 20, (n, 1))
        rows.append(dict(image_id=f"vcr-{i}", source="vcr", split="train", width=64, height=64,
                         boxes=boxes, confidences=rng.uniform(0.3, 1, n),
                         features=rng.normal(size=(n, D)), soft_labels=rng.dirichlet(
                             np.ones(C), n),
                         captions=[f"what is left of the cube {i} ? [SEP] the red ball is . "
                                   f"[SEP] because it is near the cube ."], pixels=None))
    write_image_shard(d / "vcr" / "part-00000.parquet", image_table(rows, D, C),
                      feature_extractor="test-random", feature_dim=D, num_classes=C)
    return d / "vcr"


def test_pretraining_batches_carry_vcr_segment_types(vcr_source):
    cfg = DataConfig(sources=(SourceConfig("vcr", str(vcr_source)),), batch_units=800,
                     bucket_window=64, text_segment_types=(0, 2, 3))
    src = local_batches(plan_data(cfg, {"mlm": 1, "mrfr": 1}))
    try:
        batch = src.next("mlm")
    finally:
        src.close()
    tok = load_tokenizer(None)
    types, mask = batch[K.TEXT_TYPE_IDS], batch[K.TEXT_MASK].bool()
    labels = batch[K.MLM_LABELS]
    orig = torch.where(labels >= 0, labels, batch[K.INPUT_IDS])   # ids before MLM
    for row in range(len(types)):
        seps = (orig[row] == tok.sep_id).nonzero()[:, 0].tolist()
        assert len(seps) == 3                                       # 2 interior + closing
        n = int(mask[row].sum())
        want = [0] * seps[0] + [2] * (seps[1] - seps[0]) + [3] * (n - seps[1])
        assert types[row, :n].tolist() == want
        assert (labels[row, seps] == -100).all()                    # [SEP]s never masked
    assert batch[K.TEXT_TYPE_IDS].dtype == torch.long


def _experiment(tmp_path, source, token_types):
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    return load_experiment_config(data={
        "run": {"name": "vcr2", "output_dir": str(tmp_path)},
        "model": {"family": "uniter-tiny", "token_types": token_types},
        "data": {"sources": {"vcr": {"path": str(source)}}, "batch_input_units": 800},
        "tasks": {"mlm": 2, "mrfr": 1, "mrc-kl": 1},
        "train": {"steps": 10}, "optimizer": {"warmup_steps": 1}})


def test_stage2_config_types_data_and_grows_the_table(tmp_path, vcr_source):
    from vlp.platform.pretrain.components import PretrainComponents
    from vlp.platform.pretrain.data import prepare

    cfg = _experiment(tmp_path, vcr_source, "vcr")
    setup = prepare(cfg)
    assert setup.stages[0].plan.config.text_segment_types == (0, 2, 3)
    model = PretrainComponents(setup).build_model(cfg, list(setup.tasks))
    table = model.backbone.text_embeddings.token_type_embeddings.weight
    assert table.shape[0] == 4
    torch.testing.assert_close(table[2], table[0])     # answer, rationale start as the text row
    torch.testing.assert_close(table[3], table[0])
    plain = prepare(_experiment(tmp_path, vcr_source, ""))
    assert plain.stages[0].plan.config.text_segment_types == ()


def test_vcr_finetune_loads_a_stage2_checkpoint(tmp_path):
    from vlp.benchmarks import get_benchmark

    model, _, _ = create_model("uniter-tiny", ["mlm"])
    extend_for(model.backbone, "vcr")
    with torch.no_grad():
        model.backbone.text_embeddings.token_type_embeddings.weight[3] += 1.0
    path = tmp_path / "stage2.pt"
    torch.save(model.state_dict(), path)
    weights = ckpt.read(path)
    vocab = model.backbone.text_embeddings.word_embeddings.num_embeddings
    ckpt.check_fits(weights, "uniter-tiny", model.feat_dim, vocab)
    vcr = get_benchmark("vcr")
    assert ckpt.check_type_rows(weights, "uniter-tiny", "vcr", vcr.token_types) == 2
    with pytest.raises(CheckpointError, match="4 rows, 2 beyond"):
        ckpt.check_type_rows(weights, "uniter-tiny", "vqa", get_benchmark("vqa").token_types)
    fresh, _, _ = create_model("uniter-tiny", ["itm"])
    extend_for(fresh.backbone, vcr.token_types)
    ckpt.load_into(fresh, weights)
    assert extend_for(fresh.backbone, "vcr") == {   # not again
        "vcr_types": {"q2a": (0, 2), "qa2r": (0, 2, 3)}}
    torch.testing.assert_close(fresh.backbone.text_embeddings.token_type_embeddings.weight,
                               model.backbone.text_embeddings.token_type_embeddings.weight)
