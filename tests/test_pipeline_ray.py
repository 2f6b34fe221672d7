"""The Ray Data pipeline: the same rows as the local stream, fixed-size batches through
iter_torch_batches, and a 2-worker Ray Train run whose workers see disjoint data."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from pipeline_world import write_source
from vlp.contract import batch_spec as K
from vlp.datasets.stream.data_config import DataConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.batching.image_block import image_key
from vlp.datasets.stream.local_stream import local_blocks

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("rayworld")
    ids = write_source(d, "coco", 60, shards=3, val_every=9)
    ids += write_source(d, "cc", 40, shards=2, seed=1, captions=(1, 1))
    cfg = DataConfig(sources=(SourceConfig("coco", str(d / "coco")),
                              SourceConfig("cc", str(d / "cc"))),
                     batch_units=600, bucket_window=64, read_rows=8)
    return d, ids, plan_data(cfg, {"itm": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1})


def rows_of(tables):
    out = {}
    for t in tables:
        for r in t.select(["image_id", "source_index", "caption_ids", "num_regions"]).to_pylist():
            out[r["image_id"]] = r
    return out


@pytest.fixture(scope="module")
def dataset(ray_local, world):
    """The streaming pipeline, executed once (Ray Data start-up costs seconds here)."""
    from vlp.datasets.stream.pipeline import build_dataset
    return build_dataset(world[2]).materialize()


def test_ray_dataset_matches_local_stream(dataset, world):
    _, ids, plan = world
    ray_rows = rows_of(dataset.iter_batches(batch_size=16, batch_format="pyarrow"))
    local_rows = rows_of(local_blocks(plan)(0))
    assert set(ray_rows) == set(local_rows) == set(ids)
    assert ray_rows == local_rows   # source index from the file path, tokens, regions
    assert {r["source_index"] for i, r in ray_rows.items() if i.startswith("cc")} == {1}


def test_iter_torch_batches_with_task_collate(dataset, world):
    from vlp.datasets.stream.pipeline import TaskCollateFn
    _, _, plan = world
    batches = list(dataset.iter_torch_batches(batch_size=8, collate_fn=TaskCollateFn(plan, "mlm")))
    assert batches and all((b[K.MLM_LABELS] != -100).any(1).all() for b in batches)
    pairs = sum(len(r["caption_ids"]) for r in rows_of(local_blocks(plan)(0)).values())
    assert sum(int(b[K.NUM_EXAMPLES]) for b in batches) == pairs   # every pair, once


def footer_reader_actors() -> set[str]:
    """Every Parquet ``FooterReader`` actor this Ray has started (alive or dead)."""
    import ray
    from ray.util.state import list_actors

    found = list_actors(address=ray.get_runtime_context().gcs_address, limit=10_000,
                        raise_on_missing_output=False)
    return {a.actor_id for a in found if a.class_name == "FooterReader"}


def test_the_read_lists_its_few_shards_with_one_footer_actor_per_listing(dataset, world,
                                                                          monkeypatch):
    """Ray Data lists a Parquet read's files through a pool of FooterReader actors (32 by
    default, a Python process each) at the schema sample and again when the read runs; a
    plan of 5 shards gets one actor per listing (``footer_readers``), and the user's
    RAY_DATA_PARQUET_FOOTER_NUM_ACTORS stands."""
    import os

    from vlp.datasets.stream.footer_readers import ENV, footer_readers, sized_footer_pool
    from vlp.datasets.stream.pipeline import build_dataset

    monkeypatch.delenv(ENV, raising=False)
    assert (footer_readers(1), footer_readers(256), footer_readers(257),
            footer_readers(10**6)) == (1, 1, 2, 32)
    before = footer_reader_actors()
    ds = build_dataset(world[2], reshuffle_files=False)
    assert sum(1 for _ in ds.iter_batches(batch_size=64, batch_format="pyarrow")) > 0
    started = footer_reader_actors() - before
    assert 1 <= len(started) <= 2, started          # Ray's default would start up to 2 x 32
    assert ENV not in os.environ                    # set for the read only
    monkeypatch.setenv(ENV, "3")
    with sized_footer_pool(5):
        assert os.environ[ENV] == "3"


def _train_loop(config):
    """A stand-in for the platform's loop: draw the task, take the batch, record what it saw."""
    import ray.train

    from vlp.datasets.batching.pretrain_batches import PretrainBatches
    from vlp.datasets.batching.task_sampler import TaskSampler
    from vlp.datasets.stream.pipeline import shard_blocks
    from vlp.platform.pretrain.components import AnyRank

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    plan = config["plan"]
    # as the platform's loop builds it: the ranks agree on each epoch's end
    batches = PretrainBatches(plan, shard_blocks(ray.train.get_dataset_shard("train"), plan),
                              rank=rank, world_size=world, with_ids=True, epoch_sync=AnyRank())
    sampler = TaskSampler(config["mix"], seed=11)
    epoch0, steps = set(), 0
    while batches.epoch < 1 or steps < 5:   # through epoch 0 and into epoch 1 (barrier)
        task = sampler.next()
        b = batches.next(task)
        if batches.epoch == 0:
            epoch0 |= set(b["example_image_key"].tolist()) | set(b["example_text_key"].tolist())
        assert int(b[K.INPUT_UNITS]) <= plan.config.batch_units
        steps += 1
    batches.close()
    with open(f"{config['out']}/rank{rank}.json", "w") as f:
        json.dump({"keys": sorted(epoch0), "stats": dict(batches.stats)}, f)


def test_two_worker_train_run_sees_disjoint_data(dataset, world, tmp_path):
    import ray.cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    _, ids, plan = world
    # the workers cannot import this test module: ship the loop function by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"plan": plan, "mix": {"itm": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1},
                           "out": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name="pipeline-disjoint", storage_path=str(tmp_path / "runs")),
        datasets={"train": dataset})
    trainer.fit()
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    a, b = (set(s["keys"]) for s in seen)
    assert a and b and not a & b                      # disjoint shards, ITM swaps included
    assert a | b <= {image_key(i) for i in ids}
    assert len(a | b) >= 0.6 * len(ids)   # (source weights down-sample coco: not every image)
    # (the task draws of this stand-in loop are its own; that the platform's loop draws the
    # same tasks on every rank is checked on a real run: test_pretrain_train.py)
