"""A world in shared storage (s3://, moto's server here: the tiny world copied into a bucket)
is the same world read from its URI: the manifest and its checks; a finetune's preflight and
its worker's training batches, evaluation and scores, for benchmarks that read every kind of
world file a finetune reads (task tables, image shards, the ground-truth-box sidecar, VQA's
answer vocabulary); and a sweep's whole preflight, which plans pretraining from the world's shards
in the bucket. A missing world or file fails in one line naming the URI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vlp.datasets.downstream import DownstreamDataError
from vlp.datasets.downstream.base import image_store
from vlp.datasets.storage.world import WorldError, load_manifest
from vlp.benchmarks import get_benchmark
from vlp.platform.finetune import load_finetune_config
from vlp.platform.finetune.preflight import prepare
from vlp.platform.finetune.run import components_for
from vlp.platform.training.protocols import WorkerInfo

BUCKET = "worlds"
# task tables and image shards, the answer vocabulary (vqa), the gt-box sidecar (refcoco+-gt)
BENCHMARKS = ("vqa", "refcoco+-gt")
SWEEP = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "sweep-tiny.yaml"


@pytest.fixture(scope="module")
def world_uri(s3_server, tiny_world):
    s3_server.create_bucket(BUCKET)
    return s3_server.upload(tiny_world, f"{BUCKET}/tiny")


@pytest.fixture
def node(s3_env, world_uri, monkeypatch):
    """A cluster node's environment; the world's URI."""
    for k in ("VLP_STORAGE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(k, raising=False)
    return world_uri


def test_the_manifest_read_from_the_uri_is_the_local_one(node, tiny_world):
    local, remote = load_manifest(tiny_world), load_manifest(node + "/")
    assert remote == local and remote.root == node
    assert remote.task_file("vqa", "val") == f"{node}/{local.tasks['vqa']['val']}"
    assert remote.image_files("downstream") == [
        f"{node}/{Path(f).relative_to(tiny_world).as_posix()}"
        for f in local.image_files("downstream")]


def test_a_missing_world_or_file_fails_in_one_line_naming_the_uri(node, s3_env, tiny_world,
                                                                   tmp_path):
    def error(world: str) -> str:
        with pytest.raises(WorldError) as e:
            load_manifest(world)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert error(f"s3://{BUCKET}/nowhere") == f"s3://{BUCKET}/nowhere: no such folder"
    assert error("s3://no-such-bucket/w") == "s3://no-such-bucket/w: no such folder"
    m = load_manifest(tiny_world)
    listed = [f for s in m.sources.values() for fs in s.files.values() for f in fs]
    s3_env.upload(tiny_world / listed[0], f"{BUCKET}/partial/{listed[0]}")
    assert error(f"s3://{BUCKET}/partial").startswith(
        f"s3://{BUCKET}/partial: not a vlp world: no manifest.json")
    s3_env.upload(tiny_world / "manifest.json", f"{BUCKET}/partial/manifest.json")
    assert error(f"s3://{BUCKET}/partial") == (f"s3://{BUCKET}/partial/manifest.json: lists "
                                              f"{listed[1]} but the file is missing")
    with pytest.raises(DownstreamDataError, match=f"^s3://{BUCKET}/nowhere: no such folder$"):
        prepare(finetune_config(f"s3://{BUCKET}/nowhere", "vqa", tmp_path / "runs"))


def finetune_config(world: str, benchmark: str, runs: Path):
    return load_finetune_config(data={
        "world": world, "benchmarks": [benchmark], "model": {"init": "random"},
        "run": {"name": "ft", "output_dir": str(runs)},
        "mlflow": {"enabled": False}}).resolved_paths()


def finetune_pieces(world: str, benchmark: str, runs: Path) -> tuple[dict, dict, list[str]]:
    """What a finetune worker does with the world, in this process: its first training batch,
    then the evaluation of a (seeded, untrained) model: (batch, scores + predictions, the
    image shards read)."""
    cfg = finetune_config(world, benchmark, runs)
    assert cfg.world == world                            # a URI is not made a local path
    prepared = prepare(cfg)                              # the driver's preflight
    _, batch_size, _, options = cfg.settings_for(benchmark)
    comp = components_for(cfg, benchmark, prepared, batch_size, options)
    worker = WorkerInfo(0, 1, 0, torch.device("cpu"), 0)
    batch = comp.build_batch_source(None, None, 0, worker).next(get_benchmark(benchmark).task)
    torch.manual_seed(0)
    out = comp.after_training(None, comp.build_model(None, []), worker)
    out["predictions"] = json.loads(Path(out["predictions"]).read_text())["predictions"]
    gt = benchmark == "refcoco+-gt"
    return batch, out, image_store(comp.ctx.data, cfg.eval.split, gt).files


def test_a_finetune_reads_the_same_data_and_scores_from_the_uri(node, tiny_world, tmp_path):
    for name in BENCHMARKS:
        batch, out, files = finetune_pieces(str(tiny_world), name, tmp_path / "local")
        batch_s3, out_s3, files_s3 = finetune_pieces(node, name, tmp_path / "s3")
        assert all(f.startswith(f"{node}/") for f in files_s3), (name, files_s3)
        assert [f.rsplit("/", 1)[1] for f in files_s3] == [Path(f).name for f in files]
        assert batch.keys() == batch_s3.keys(), name
        for k in batch:
            torch.testing.assert_close(batch_s3[k], batch[k], msg=f"{name} {k}")
        assert out_s3 == out, name


def test_a_sweep_over_a_world_uri_passes_its_whole_preflight(node, tmp_path):
    from vlp.contract.config_loader import ConfigError
    from vlp.platform.sweep import load_sweep_config
    from vlp.platform.sweep.preflight import check_sweep
    from vlp.platform.sweep.trial_configs import data_sources

    def config(world: str):
        return load_sweep_config(SWEEP, [f"world={world}", f"sweep.output_dir={tmp_path}",
                                         "finetune.benchmarks=[vqa]"]).resolved()

    cfg = config(node)
    assert cfg.world == node                             # not <cwd>/s3:/worlds/tiny
    assert {s["path"] for s in data_sources(cfg.world, "both").values()} == {
        f"{node}/images/{s}" for s in ("coco", "vg", "cc", "sbu")}
    plan = check_sweep(cfg)          # pretraining planned from the bucket's shards, finetune too
    assert [name for name, _ in plan.first] == ["none", "paper-best"]
    with pytest.raises(ConfigError) as e:
        check_sweep(config(f"s3://{BUCKET}/nowhere"))
    assert dict(e.value.problems) == {"world": f"s3://{BUCKET}/nowhere: no such folder"}
