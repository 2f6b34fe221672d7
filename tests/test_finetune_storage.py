"""A finetune's (and a zero-shot evaluation's) outputs follow the run's storage: rank 0 writes
its predictions into it (S3 here, moto's server), atomically, and the driver reads them from
there into MLflow, whichever node rank 0 ran on. Zero-shot starts its workers through the
same launch path as every job (a set-up error fails once). No Ray started."""

from __future__ import annotations

import dataclasses
import json

import pyarrow.fs as pafs
import pytest
import torch
from test_finetune_tracking import fake_pretraining_checkpoint

from vlp.platform.cluster import run_storage
from vlp.platform.finetune import load_finetune_config, tracking
from vlp.platform.finetune.preflight import prepare
from vlp.platform.finetune.run import components_for
from vlp.platform.tracking.mlflow_run import MlflowRun, embedded_tracking_uri
from vlp.platform.training.protocols import WorkerInfo

BUCKET = "ft-outputs"


@pytest.fixture
def on_s3(s3_env, monkeypatch):
    """The job's environment on a cluster node: the endpoint, keys and VLP_STORAGE."""
    s3_env.create_bucket(BUCKET)
    monkeypatch.setenv("VLP_STORAGE", f"s3://{BUCKET}/vlp")
    return s3_env


def zero_shot_config(tiny_world, tmp_path, **extra):
    _, folder = fake_pretraining_checkpoint(tmp_path)
    return load_finetune_config(data={
        "world": str(tiny_world), "benchmarks": ["retrieval"], "model": {"checkpoint": str(folder)},
        "run": {"name": "ft", "output_dir": str(tmp_path / "local")},
        "mlflow": {"enabled": False}, **extra}).resolved_paths()


def test_rank_zero_writes_predictions_into_the_runs_s3_storage(on_s3, tiny_world, tmp_path):
    cfg = zero_shot_config(tiny_world, tmp_path)
    _, bs, _, options = cfg.settings_for("retrieval")
    comp = components_for(cfg, "retrieval", prepare(cfg), bs, options, zero_shot=True)
    out = comp.after_training(None, comp.build_model(None, []),
                              WorkerInfo(0, 1, 0, torch.device("cpu"), 0))
    folder = f"s3://{BUCKET}/vlp/ft-retrieval/predictions"
    assert out["predictions"].startswith(folder + "/"), out["predictions"]
    name = out["predictions"].rsplit("/", 1)[1]
    fs = on_s3.filesystem()
    listed = [i.path for i in fs.get_file_info(pafs.FileSelector(
        f"{BUCKET}/vlp/ft-retrieval/predictions"))]
    assert listed == [f"{BUCKET}/vlp/ft-retrieval/predictions/{name}"]   # no temporary left
    with fs.open_input_stream(listed[0]) as f:
        saved = json.loads(f.read())
    assert saved["metrics"] == out["metrics"] and saved["predictions"]
    assert not (tmp_path / "local").exists()           # nothing on the node rank 0 ran on

    # the driver (another node on a cluster) logs it to MLflow from the storage
    uri = embedded_tracking_uri(tmp_path / "mlflow")
    run = MlflowRun.open(uri, "vlp-finetune", run_name="ft-retrieval")
    tracking.log_benchmark(uri, run.run_id, {"finetune.benchmark": "retrieval"},
                           out["metrics"], out["predictions"])
    arts = [a.path for a in run.client.list_artifacts(run.run_id, "predictions")]
    assert arts == [f"predictions/{name}"]


class MoveFails:
    """The storage's filesystem, whose final step of a write (the move) fails: a connection
    lost after the bytes went up."""

    def __init__(self, fs):
        self.fs = fs

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def move(self, src, dst):
        raise OSError("connection reset")


def test_a_write_that_fails_leaves_no_file_under_the_final_name(on_s3):
    storage = run_storage.open_location(f"s3://{BUCKET}/vlp/atomic")
    storage.write_text('{"old": true}', "p.json")
    failing = dataclasses.replace(storage, fs=MoveFails(storage.fs))
    for name in ("p.json", "q.json"):
        with pytest.raises(OSError, match="connection reset"):
            failing.write_text('{"new": true}', name)
    assert storage.read_text("p.json") == '{"old": true}' and not storage.exists("q.json")
    files = on_s3.filesystem().get_file_info(pafs.FileSelector(f"{BUCKET}/vlp/atomic"))
    assert [i.path.rsplit("/", 1)[1] for i in files] == ["p.json"]     # no temporary left


def test_zero_shot_starts_its_workers_through_the_fail_once_launch(on_s3, tiny_world, tmp_path,
                                                                    monkeypatch):
    import ray.train.torch

    import vlp.platform.finetune.zero_shot as zero_shot
    import vlp.platform.training.fail_once as fail_once

    seen = {}

    class Stop(Exception):
        pass

    def capture(**kwargs):
        seen.update(kwargs)
        raise Stop

    def plain(*args, **kwargs):
        raise AssertionError("a plain TorchTrainer: a set-up error would be retried")

    monkeypatch.setattr(fail_once, "FailOnceTorchTrainer", capture)
    monkeypatch.setattr(ray.train.torch, "TorchTrainer", plain)
    monkeypatch.setattr(zero_shot, "ensure_ray", lambda *a, **k: None)
    monkeypatch.setattr(run_storage, "alive_nodes", lambda: 1)
    cfg = zero_shot_config(tiny_world, tmp_path, mlflow={"enabled": False})
    with pytest.raises(Stop):
        zero_shot.evaluate_zero_shot(cfg.model_copy(update=dict(model=cfg.model.model_copy(
            update=dict(init="checkpoint")))))
    assert seen["train_loop_per_worker"] is zero_shot.eval_loop_per_worker
    run_config = seen["run_config"]
    # the run's storage (S3), not a folder under the driver's working dir
    assert run_config.storage_path == f"{BUCKET}/vlp"
    assert isinstance(run_config.storage_filesystem, pafs.S3FileSystem)
    assert run_config.name == "ft-zero-shot-retrieval"
    assert seen["train_loop_config"]["components"].predictions_dir == \
        f"s3://{BUCKET}/vlp/ft-zero-shot-retrieval/predictions"
