"""Errors that are not faults fail once: a wrong initial checkpoint is refused on the driver
before Ray starts, in one line naming the file and the mismatch; a set-up error inside a Ray
Train worker ends the run at once (no retries) with its one-line cause and leaves no empty
run folder; worker faults are still retried."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from vlp.contract.config_loader import ConfigError
from vlp.platform.training.failures import SetupError, remove_if_empty, setup_error_of, setup_phase
from vlp.platform.pretrain.job import load_pretrain_config, pretrain

JOB = Path(__file__).parents[1] / "jobs" / "pretrain.py"
TASKS = ["itm", "mlm"]


@pytest.fixture
def base(tiny_world, tmp_path):
    images = Path(tiny_world) / "images"
    return {"run": {"name": "bad", "output_dir": str(tmp_path / "runs")},
            "model": {"family": "uniter-tiny"}, "tasks": {t: 1 for t in TASKS},
            "data": {"sources": {"coco": {"path": str(images / "coco")}}},
            "train": {"steps": 10}, "optimizer": {"warmup_steps": 2}, "mlflow": {"enabled": False}}


@pytest.fixture(scope="module")
def uniter_files(tmp_path_factory):
    """A UNITER-layout file that fits uniter-tiny on the tiny world (D=64, C=17), one whose
    region width is wrong, one with another vocabulary, a truncated one, a BERT one."""
    from vlp.models import create_model
    from vlp.models.checkpoints import save_uniter

    d = tmp_path_factory.mktemp("init-files")
    save_uniter(create_model("uniter-tiny", TASKS, region_feat_dim=64, num_classes=17).model,
                d / "good.pt")
    save_uniter(create_model("uniter-tiny", TASKS, region_feat_dim=32, num_classes=17).model,
                d / "width32.pt")
    save_uniter(create_model("uniter-tiny", TASKS, region_feat_dim=64, num_classes=17,
                             vocab_size=28996).model, d / "vocab28996.pt")
    data = (d / "good.pt").read_bytes()
    (d / "truncated.pt").write_bytes(data[: len(data) // 2])
    torch.save({"bert.embeddings.word_embeddings.weight": torch.zeros(10, 5)}, d / "bert.pt")
    return d


def refused(base, path, start_ray_calls):
    with pytest.raises(ConfigError) as e:
        pretrain(load_pretrain_config(data=base, overrides=["model.init=uniter",
                                                             f"model.init_path={path}"]),
                 progress=False, say=lambda line: None,
                 start_ray=lambda: start_ray_calls.append(1))
    assert not (Path(base["run"]["output_dir"]) / "bad").exists()
    msg = str(e.value)
    assert "\n" not in msg and f"model.init_path: {path}" in msg
    return msg


def test_a_checkpoint_that_does_not_fit_is_refused_before_ray_starts(base, uniter_files):
    calls: list[int] = []
    msg = refused(base, uniter_files / "width32.pt", calls)
    assert "img_linear.weight" in msg and "[64, 32]" in msg and "[64, 64]" in msg
    msg = refused(base, uniter_files / "vocab28996.pt", calls)
    assert "vocabulary size 28996 vs the model's 30522" in msg
    msg = refused(base, uniter_files / "bert.pt", calls)
    assert "'bert.embeddings.word_embeddings.weight' is not part of the UNITER layout" in msg
    assert "uniter-tiny" in refused(base, uniter_files / "truncated.pt", calls)
    assert calls == []                                     # Ray never started


def test_check_flag_refuses_it_in_one_line_and_passes_a_fitting_one(base, uniter_files,
                                                                    tmp_path, capsys):
    import yaml

    cfg = tmp_path / "job.yaml"
    cfg.write_text(yaml.safe_dump(base))
    spec = importlib.util.spec_from_file_location("pretrain_job_script", JOB)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    status = job.main(["--config", str(cfg), "--check", "--set", "model.init=uniter",
                       "--set", f"model.init_path={uniter_files / 'width32.pt'}"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and "\n" not in err
    assert err.startswith("pretrain failed: ConfigError") and "width32.pt" in err
    assert job.main(["--config", str(cfg), "--check", "--set", "model.init=uniter",
                     "--set", f"model.init_path={uniter_files / 'good.pt'}"]) == 0


def test_setup_phase_turns_deterministic_errors_into_one_line_and_passes_faults():
    from vlp.models.checkpoints import CheckpointError

    for error in (CheckpointError("key 'x' has shape [2]\n but the model expects [3]"),
                  FileNotFoundError("shard.parquet"), KeyError("mlm"), ImportError("nope")):
        with pytest.raises(SetupError) as e, setup_phase("rank 1 set-up"):
            raise error
        assert str(e.value).startswith(f"rank 1 set-up: {type(error).__name__}: ")
        assert "\n" not in str(e.value)
    for fault in (RuntimeError("NCCL error: unhandled system error"), TimeoutError("store"),
                  ConnectionResetError("peer"), MemoryError()):
        with pytest.raises(type(fault)), setup_phase("rank 0 set-up"):
            raise fault


def test_the_policy_raises_setup_errors_and_retries_faults():
    from ray.exceptions import RayActorError
    from ray.train import FailureConfig
    from ray.train.v2._internal.execution.failure_handling import FailureDecision
    from ray.train.v2.api.exceptions import WorkerGroupError

    from vlp.platform.training.fail_once import SetupErrorsFailOnce

    policy = SetupErrorsFailOnce(FailureConfig(max_failures=3))
    setup = WorkerGroupError("x", {0: RuntimeError("collective aborted"),
                                   1: SetupError("rank 1 set-up: ValueError: bad")})
    assert policy.make_decision(setup) == FailureDecision.RAISE
    assert setup_error_of(setup) is setup.worker_failures[1]
    fault = WorkerGroupError("x", {0: RuntimeError("NCCL timeout"), 1: RayActorError()})
    assert setup_error_of(fault) is None
    assert [policy.make_decision(fault) for _ in range(4)] == [FailureDecision.RETRY] * 3 + [
        FailureDecision.RAISE]


def test_remove_if_empty_deletes_only_a_folder_without_checkpoints(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".validate_storage_marker").write_text("")
    assert remove_if_empty(str(run)) and not run.exists()
    run.mkdir()
    (run / ".validate_storage_marker").write_text("")
    (run / "checkpoint_step00000010").mkdir()
    assert not remove_if_empty(str(run)) and run.exists()
    assert not remove_if_empty(str(tmp_path / "never-created"))


@pytest.mark.integration
def test_a_worker_setup_error_is_not_retried(ray_local, tmp_path):
    """A Ray Train worker whose model build raises a ValueError, max_failures=3: one attempt,
    a one-line SetupError from run_pretraining, no run folder left."""
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import run_pretraining
    from vlp.testing.toy import ToyComponents

    cfg = load_experiment_config(data={
        "run": {"name": "setup-error", "output_dir": str(tmp_path / "runs"), "max_failures": 3},
        "model": {"family": "toy"}, "data": {"sources": {"web": {"path": "/unused"}}},
        "tasks": {"mlm": 1}, "train": {"steps": 4}, "optimizer": {"warmup_steps": 1},
        "mlflow": {"enabled": False},
        "scaling": {"num_workers": 1, "cpus_per_worker": 1}})
    attempts = tmp_path / "attempts.txt"
    with pytest.raises(SetupError) as e:
        run_pretraining(cfg, ToyComponents(setup_error="init file has 3 layers, model has 2",
                                           attempts_file=str(attempts)))
    assert "set-up: ValueError: init file has 3 layers, model has 2" in str(e.value)
    assert attempts.read_text().count("build_model") == 1          # one attempt
    assert not (tmp_path / "runs" / "setup-error").exists()
