"""Bad inputs to a pretraining job fail before any training starts, each with an error that
names the cause: an unknown key or a typo, an unknown task, a task that does not apply to the
family, a missing shard folder, an unreachable MLflow server; the job script turns them into
one line and a non-zero exit status. No Ray, no compute."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

from vlp.contract.config_loader import ConfigError
from vlp.platform.pretrain.job import load_pretrain_config, pretrain
from vlp.platform.tracking.mlflow_run import TrackingUnreachable

JOB = Path(__file__).parents[1] / "jobs" / "pretrain.py"


@pytest.fixture
def base(tiny_world, tmp_path):
    images = Path(tiny_world) / "images"
    return {"run": {"name": "bad", "output_dir": str(tmp_path / "runs")},
            "model": {"family": "uniter-tiny"},
            "data": {"sources": {"coco": {"path": str(images / "coco")},
                                 "cc": {"path": str(images / "cc")}}},
            "train": {"steps": 10}, "optimizer": {"warmup_steps": 2}}


def fails(base, *overrides, error=ConfigError) -> str:
    """The error message; and nothing was started (no run folder, no MLflow store)."""
    with pytest.raises(error) as e:
        pretrain(load_pretrain_config(data=base, overrides=overrides), progress=False,
                 say=lambda line: None)
    root = Path(base["run"]["output_dir"])
    assert not (root / "bad").exists() and not (root / "mlflow.db").exists()
    return str(e.value)


def test_unknown_keys_and_typos_name_the_key(base):
    msg = fails(base, "optimizer.learning_rate=1e-4", "data.mask_prb=0.2", "trian.steps=5")
    assert "optimizer.learning_rate: unknown key" in msg
    assert "data.mask_prb" in msg and "did you mean 'mask_prob'?" in msg
    assert "did you mean 'train'?" in msg
    assert "data.regions.min_regions" in fails(base, "data.regions.min_regions=0")


def test_unknown_task_and_tasks_invalid_for_the_family(base):
    assert "unknown task 'mrm'" in fails(base, "tasks={mlm: 1, mrm: 1}")
    msg = fails(base, "tasks={mlm: 1, mvm: 1}")
    assert "tasks.mvm: task 'mvm' does not apply to uniter-tiny" in msg
    msg = fails(base, "model.family=soho-tiny")          # the default mix has region tasks
    assert "tasks.mrfr" in msg and "reads pixels" in msg
    msg = fails(base, "stages=[{name: a, steps: 5}, {name: b, steps: 5, tasks: {moc: 1}}]",
                "train.steps=0")
    assert "stages.1.tasks.moc: task 'moc' does not apply to uniter-tiny" in msg


def test_missing_weights_file_names_the_key(base, tmp_path):
    msg = fails(base, "model.init=bert", f"model.init_path={tmp_path / 'bert.pt'}")
    assert "model.init_path" in msg and "no such file" in msg


def test_missing_shard_folder_names_the_source(base, tmp_path):
    msg = fails(base, f"data.sources.cc.path={tmp_path / 'nowhere'}")
    assert "data.sources.cc.path" in msg and "no such folder" in msg
    (tmp_path / "empty").mkdir()
    assert "holds no Parquet shards" in fails(base, f"data.sources.cc.path={tmp_path / 'empty'}")


def test_unreachable_mlflow_server_fails_fast(base):
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    msg = fails(base, f"mlflow.tracking_uri=http://127.0.0.1:{port}",
                "mlflow.check_timeout_s=1", error=TrackingUnreachable)
    assert f"127.0.0.1:{port}" in msg and "unreachable" in msg


def test_job_script_exits_non_zero_with_one_line(base, tmp_path, capsys):
    import yaml

    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(base))
    spec = importlib.util.spec_from_file_location("pretrain_job_script", JOB)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    status = job.main(["--config", str(cfg), "--set", "tasks={mlm: 1, mvm: 1, mrm: 1}"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and "\n" not in err
    assert err.startswith("pretrain failed: ConfigError") and "tasks.mrm" in err
    assert job.main(["--config", str(cfg), "--check"]) == 0      # the valid config passes
    assert "global batch" in capsys.readouterr().out
