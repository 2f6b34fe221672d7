"""The general loop's own config: pretraining and finetuning each build one from their own
config, and each job resolves and checks its config once."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from vlp.platform.pretrain import experiment_config as pretrain_config
from vlp.platform.pretrain.train_section import TrainSection
from vlp.platform.training import launch
from vlp.platform.training.loop_config import (LoopConfig, LoopOptimizer, LoopScaling, LoopStage,
                                               LoopTrain)


@pytest.mark.parametrize("loop_cls,section_cls", [
    (LoopTrain, TrainSection),
    (LoopOptimizer, pretrain_config.OptimizerSection),
    (LoopScaling, pretrain_config.ScalingSection)])
def test_loop_sections_are_projections_of_the_experiment_sections(loop_cls, section_cls):
    """Every loop field is read from the same-named experiment field (``project``), and an
    unset finetune value trains as a pretraining default would."""
    section = section_cls()
    from vlp.models.families import FAMILIES

    # train.objective "" means the family's: the default family's is what the loop gets
    family = FAMILIES[pretrain_config.ModelSection().family]
    own = {"cold_start_steps": pretrain_config.ModelSection().cold_start_steps,
           "objective": family.objective, "forward_groups": family.forward_groups}
    for f in dataclasses.fields(loop_cls):
        expected = own[f.name] if f.name in own else getattr(section, f.name)
        if isinstance(expected, list):   # the loop holds lists as tuples (frozen)
            expected = tuple(expected)
        assert getattr(loop_cls(), f.name) == expected, f.name


def counting(monkeypatch, calls, module, name):
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, wrapper)
    return wrapper


def fake_run_loop(runs):
    def run_loop(loop, components, tracking, callbacks=None, group=None):
        assert isinstance(loop, LoopConfig)
        runs.append((loop, components, tracking))
        step = loop.total_steps()
        after = {"metrics": {"ir_mean": 1.0, "tr_mean": 2.0, "r_mean": 1.5}}
        return launch.LoopResult("run", None, step, True, [], None, None,
                                 return_value={"final_step": step, "after_training": after})
    return run_loop


def test_the_pretraining_job_resolves_and_checks_once(tmp_path, monkeypatch):
    from vlp.platform.pretrain import job, run

    calls: dict[str, int] = {}
    for name in ("resolve", "preflight"):
        wrapper = counting(monkeypatch, calls, run, name)
        monkeypatch.setattr(job, name, wrapper)     # the job imported them by name
    runs: list = []
    monkeypatch.setattr(launch, "run_loop", fake_run_loop(runs))
    monkeypatch.setattr(job, "prepare", lambda cfg: SimpleNamespace(stages=()))
    monkeypatch.setattr(job, "summary", lambda cfg, setup: [])
    cfg = job.load_pretrain_config(data={
        "run": {"name": "once", "output_dir": str(tmp_path)}, "train": {"steps": 4},
        "optimizer": {"warmup_steps": 1}, "data": {"sources": {"a": {"path": "a"}}},
        "mlflow": {"enabled": False}})
    job.pretrain(cfg, progress=False, say=lambda line: None)
    assert calls == {"resolve": 1, "preflight": 1}
    (loop, _, tracking), = runs
    assert loop.storage == str(tmp_path) and loop.stages[0].steps == 4
    assert tracking["params"]["run.name"] == "once"     # the experiment config, flattened


def test_finetuning_builds_its_own_loop_config_and_checks_each_run_once(tiny_world, tmp_path,
                                                                       monkeypatch):
    from vlp.platform.finetune import load_finetune_config
    from vlp.platform.finetune import run as finetune_run
    from vlp.platform.pretrain import run as pretrain_run

    def never(*args, **kwargs):
        raise AssertionError("finetuning ran a pretraining step")
    for name in ("resolve", "preflight", "run_pretraining", "launch_pretraining"):
        monkeypatch.setattr(pretrain_run, name, never)
    calls: dict[str, int] = {}
    counting(monkeypatch, calls, launch, "resume_problem")
    runs: list = []
    monkeypatch.setattr(launch, "run_loop", fake_run_loop(runs))
    monkeypatch.setattr(finetune_run, "ensure_ray", lambda cpus: None)
    cfg = load_finetune_config(data={
        "world": str(tiny_world), "benchmarks": ["retrieval"],
        "model": {"init": "random", "checkpoint": ""},
        "run": {"name": "ft", "output_dir": str(tmp_path)},
        "settings": {"retrieval": {"steps": 5, "lr": 3e-4}}, "mlflow": {"enabled": False}})
    report = finetune_run.run_finetune(cfg)
    assert calls == {"resume_problem": 1}
    (loop, components, tracking), = runs
    assert loop.name == "ft-retrieval" and loop.storage == str(tmp_path)
    assert loop.stages == (LoopStage("finetune", 5, {"retrieval": 1.0}),)
    assert loop.optimizer.lr == 3e-4 and loop.optimizer.warmup_steps == 0
    assert loop.checkpoint_interval == 5 and loop.train.log_every == 5
    assert loop.job == "finetune"            # its log lines say [vlp finetune], not pretrain
    assert components.benchmark == "retrieval" and not tracking["enabled"]
    assert report.scores == {"ir": 1.0, "tr": 2.0}


def test_a_cpu_finetune_in_fp16_is_refused_on_load(tiny_world):
    from vlp.contract.config_loader import ConfigError
    from vlp.platform.finetune import load_finetune_config

    with pytest.raises(ConfigError, match="train.precision: fp16 is not supported on CPU"):
        load_finetune_config(data={"world": str(tiny_world), "benchmarks": ["retrieval"],
                                   "model": {"init": "random"},
                                   "train": {"precision": "fp16"}})


def test_progress_lines_name_the_job_that_runs_the_loop():
    from vlp.platform.training.progress import progress_line

    m = {"step": 100, "stage": 0, "loss": 3.5, "vqa_loss": 3.5, "examples_per_s": 500.0,
         "input_units_per_s": 11000.0, "lr": 1e-3}
    line = progress_line(m, 300, ["vqa"], run="t001-ft-vqa", job="finetune")
    assert line.startswith("[vlp finetune] t001-ft-vqa step 100/300 (vqa) loss 3.5000 | vqa 3.500")
    assert progress_line(m, 300, ["main"]).startswith("[vlp pretrain] step 100/300 (main)")
