"""Shard folders by URI (s3://, moto's server here): the data plan lists and checks the
shards in the bucket through the one URI reader (vlp.contract.uri_files, endpoint and keys
from the standard AWS environment) and the local stream reads the same rows as from a local
copy. Sources in two storages at once are refused. No Ray started."""

from __future__ import annotations

import pytest
from pipeline_world import write_source

from vlp.datasets.stream.data_config import DataConfig, DataConfigError, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches

BUCKET = "shards"
TASKS = {"mlm": 1, "itm": 1, "mrc-kl": 1}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    d = tmp_path_factory.mktemp("world")
    write_source(d, "coco", 40, shards=2, val_every=8)
    write_source(d, "cc", 30, shards=2, seed=1, captions=(1, 1))
    return d


@pytest.fixture(scope="module")
def uploaded(s3_server, folders):
    s3_server.create_bucket(BUCKET)
    s3_server.upload(folders, f"{BUCKET}/world")


@pytest.fixture
def node_env(s3_env, uploaded):
    return s3_env


def config(root):
    return DataConfig(sources=(SourceConfig("coco", f"{root}/coco", 1.0),
                               SourceConfig("cc", f"{root}/cc", 2.0)),
                      batch_units=600, bucket_window=128)


def test_the_plan_and_the_stream_read_shards_from_s3(node_env, folders):
    local = plan_data(config(str(folders)), TASKS)
    remote = plan_data(config(f"s3://{BUCKET}/world"), TASKS)
    assert remote.files and all(f.startswith(f"s3://{BUCKET}/world/") for f in remote.files)
    assert [f.rsplit("/", 2)[-2:] for f in remote.files] == \
        [f.rsplit("/", 2)[-2:] for f in local.files]
    assert (remote.feature_dim, remote.num_classes) == (local.feature_dim, local.num_classes)
    assert [(s.examples, s.rate) for s in remote.sources] == \
        [(s.examples, s.rate) for s in local.sources]
    a, b = local_batches(local), local_batches(remote)
    for _ in range(3):
        x, y = a.next("mlm"), b.next("mlm")
        assert x.keys() == y.keys()
        assert all((x[k] == y[k]).all() for k in x if hasattr(x[k], "shape"))


def test_a_missing_folder_or_mixed_storages_are_named(node_env, folders):
    with pytest.raises(DataConfigError, match=f"sources.coco.path: s3://{BUCKET}/nothing/coco: "
                                              f"no such folder"):
        plan_data(config(f"s3://{BUCKET}/nothing"), TASKS)
    mixed = DataConfig(sources=(SourceConfig("coco", str(folders / "coco")),
                                SourceConfig("cc", f"s3://{BUCKET}/world/cc")))
    with pytest.raises(DataConfigError, match="sources mix storages"):
        plan_data(mixed, TASKS)


def test_a_pretraining_job_plans_its_stages_from_s3_shards(node_env):
    from vlp.platform.pretrain.data import prepare
    from vlp.platform.pretrain.job import load_pretrain_config, resolved

    uri = f"s3://{BUCKET}/world/coco"
    cfg = resolved(load_pretrain_config(data={
        "run": {"name": "s3-data"}, "model": {"family": "uniter-tiny"}, "tasks": TASKS,
        "data": {"sources": {"coco": {"path": uri}}}, "train": {"steps": 4},
        "optimizer": {"warmup_steps": 1}, "mlflow": {"enabled": False}}))
    assert cfg.data.sources["coco"].path == uri          # not <cwd>/s3:/...
    plan = prepare(cfg).stages[0].plan
    assert plan.files and all(f.startswith(uri + "/") for f in plan.files)
