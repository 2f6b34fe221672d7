"""Bad inputs to a pretraining job fail before any training starts, each with an error that
names the cause: an unknown key or a typo, an unknown task, a task that does not apply to the
family, a missing shard folder, an unreachable MLflow server; the job script turns them into
one line and a non-zero exit status. No Ray, no compute."""

from __future__ import annotations

import argparse
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


def test_check_off_the_cluster_judges_the_config_and_lists_unreachable_inputs(capsys):
    """A cluster config on a machine without its files: valid config, inputs listed with the
    keys to point elsewhere, exit 3; a config error still exits 1 before any input is read."""
    from vlp.cli import main

    shipped = str(Path(__file__).parents[1] / "jobs" / "configs" / "uniter-base-indomain.yaml")
    assert main(["pretrain", "--config", shipped, "--check"]) == 3
    out = capsys.readouterr().out.splitlines()
    assert "is valid" in out[0] and "4 input(s) are not reachable from here" in out[0]
    listed = [line.split()[2] for line in out[1:5]]
    assert listed == ["model.init_path", "data.tokenizer_path", "data.sources.coco.path",
                      "data.sources.vg.path"]
    assert "--set model.init_path=FILE" in out[-1]
    assert len(out) <= 24                                   # one screen
    # what does not need the files is still checked
    assert main(["pretrain", "--config", shipped, "--check", "--set",
                 "tasks={mlm: 1, mvm: 1}"]) == 1
    assert "tasks.mvm" in capsys.readouterr().err


def test_steps_below_the_warm_up_fit_it_and_say_so(tmp_path):
    from vlp.commands.pretrain import fitted_to_steps

    shipped = Path(__file__).parents[1] / "jobs" / "configs" / "pretrain-tiny.yaml"   # warm-up 4
    args = lambda steps, *sets: argparse.Namespace(config=str(shipped), steps=steps,  # noqa: E731
                                                   set=list(sets))
    extra, notes = fitted_to_steps(args(4))
    assert extra == ["optimizer.warmup_steps=0"] and "warmup_steps 4 → 0" in notes[0]
    assert fitted_to_steps(args(40)) == ([], [])             # it fits already
    assert fitted_to_steps(args(4, "optimizer.warmup_steps=3")) == ([], [])   # the user's
    assert fitted_to_steps(args(None)) == ([], [])
    cfg = load_pretrain_config(shipped, ["train.steps=4"] + extra)   # the config check passes
    assert cfg.optimizer.warmup_steps == 0


def test_local_runs_keep_to_a_run_of_their_own_unless_named():
    from vlp.commands.pretrain import local_name

    shipped = Path(__file__).parents[1] / "jobs" / "configs" / "pretrain-tiny.yaml"  # 2 workers
    cfg = load_pretrain_config(shipped)
    ns = lambda name=None, *sets: argparse.Namespace(name=name, set=list(sets))  # noqa: E731
    assert local_name(ns(), cfg).run.name == "pretrain-tiny-local"
    assert local_name(ns("mine"), cfg).run.name == "pretrain-tiny"    # --name already applied
    assert local_name(ns(None, "run.name=x"), cfg).run.name == "pretrain-tiny"
