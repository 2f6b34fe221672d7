"""Integration: a tiny sweep on real Ray Tune + Ray Train + MLflow, interrupted after its first
trial finishes (SIGUSR1, as Ctrl-C would) and resumed by running it again (Tuner.restore).

One sweep serves these tests (each Train run costs ~20 s here): 2 trials — no pretraining
and the paper's best mix — one finetune stage each (vqa, 2 steps): three Train runs in all
(two-stage trials and ASHA between stages: test_sweep_asha.py). (A repeated
point is no trial: tests/test_sweep_tune.py; a bad text init is refused before any trial:
tests/test_sweep_preflight.py.)"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import ray.tune

from vlp.platform.sweep import load_sweep_config, run_sweep

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "sweep-tiny.yaml"


class InterruptAfterFirstTrial(ray.tune.Callback):
    """Sends SIGUSR1 (Tune's stop signal) once, when the first trial ends. The marker file
    keeps the restored copy of this callback (Tune restores callbacks) from firing again."""

    def __init__(self, marker: str):
        self.marker = marker

    def on_trial_complete(self, iteration, trials, trial, **info):
        if not os.path.exists(self.marker):
            Path(self.marker).write_text(trial.trial_id)
            os.kill(os.getpid(), signal.SIGUSR1)


@pytest.fixture(scope="module")
def overrides(tiny_world, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    # a bad text init no longer reaches a trial: the preflight refuses it before anything
    # starts (test_sweep_preflight), so every trial here completes
    return [
        f"world={tiny_world}", f"sweep.output_dir={out}", "sweep.num_samples=2",
        "sweep.include=[none,paper-best]", "sweep.max_concurrent=1", "space.init=[random]",
        "finetune.benchmarks=[vqa]",
        # FIFO: which of two real trials scores lower at the rung is not known beforehand;
        # ASHA stopping a trial (and across a restore) is test_sweep_asha.py
        "sweep.scheduler=fifo"]


@pytest.fixture(scope="module")
def sweep(ray_local, overrides):
    out = Path(next(o for o in overrides if o.startswith("sweep.output_dir="))
               .split("=", 1)[1])
    cfg = load_sweep_config(CONFIG, overrides)
    first = run_sweep(cfg, callbacks=[InterruptAfterFirstTrial(str(out / "interrupted"))])
    second = run_sweep(cfg)
    return cfg.resolved(), first, second


def test_interrupted_sweep_resumes_without_rerunning_finished_trials(sweep):
    cfg, first, second = sweep
    assert first.interrupted and not second.interrupted
    states = {r.trial: r.state for r in first.leaderboard.rows}
    assert states["t001"] == "completed"
    assert second.trials == 2 and second.errors == 0
    assert {r.trial: r.state for r in second.leaderboard.rows} == {
        "t001": "completed", "t002": "completed"}
    trials = Path(second.trials_dir)
    assert trials.parent == cfg.sweep_dir and Path(first.trials_dir) == trials
    attempts = {t: (trials / t / "attempts.jsonl").read_text().splitlines()
                for t in ("t001", "t002")}
    assert len(attempts["t001"]) == 1                   # finished before the interrupt: kept
    assert json.loads(attempts["t001"][0])["resumed_after_stage"] == -1
    # t001's finetune runs ran once: one Ray Train run folder each, never re-created
    assert sorted(p.name for p in (trials / "t001").iterdir()
                  if p.is_dir()) == ["t001-ft-vqa"]


def test_mlflow_holds_the_sweep_and_the_leaderboard(sweep, capsys):
    from mlflow.tracking import MlflowClient

    from vlp.cli import main

    cfg, _, second = sweep
    client = MlflowClient(second.tracking_uri)
    parent = client.get_run(second.parent_run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags["vlp.job"] == "sweep"
    exp = [parent.info.experiment_id]
    trials = client.search_runs(exp, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert sorted(t.data.tags["vlp.sweep.trial"] for t in trials) == ["t001", "t002"]
    best = next(t for t in trials if t.data.tags["vlp.sweep.trial"] == "t002")
    assert best.data.tags["mix"] == "MLM+ITM+MRC-kl+MRFR"
    assert best.data.tags["pretraining_data"] == "In-domain"
    assert best.info.status == "FINISHED"
    below = client.search_runs(exp, f"tags.`mlflow.parentRunId` = '{best.info.run_id}'")
    assert sorted(r.info.run_name for r in below) == ["t002-ft-vqa", "t002-pretrain"]
    assert {r.data.tags["vlp.job"] for r in below} == {"pretrain", "finetune"}
    assert 0 <= best.data.metrics["vqa"] <= 100
    assert best.data.metrics["score"] == pytest.approx(best.data.metrics["vqa"])

    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "leaderboard")}
    assert arts == {"leaderboard/leaderboard.md", "leaderboard/leaderboard.csv",
                    "leaderboard/leaderboard.json", "leaderboard/meta_sum.png"}
    logged = client.download_artifacts(parent.info.run_id, "leaderboard/leaderboard.md",
                                       str(cfg.sweep_dir))
    table = [l for l in Path(logged).read_text().splitlines() if l.startswith("|")]
    assert len(table) == 2 + 2

    assert main(["leaderboard", "--tracking-uri", second.tracking_uri,
                 "--experiment", cfg.mlflow.experiment]) == 0
    printed = [l for l in capsys.readouterr().out.splitlines() if l.startswith("|")]
    assert printed == table                          # the same numbers, from the same runs
    assert f"{best.data.metrics['vqa']:.2f}" in next(l for l in printed if "t002" in l)


def test_a_changed_config_is_refused_on_restore(sweep, overrides):
    """The sweep's folder holds its config: running the same sweep.name with another value
    fails before any trial starts, naming the key and the folder."""
    from vlp.contract.config_loader import ConfigError

    cfg, _, _ = sweep
    with pytest.raises(ConfigError, match="sweep.num_samples") as e:
        run_sweep(load_sweep_config(CONFIG, overrides + ["sweep.num_samples=5"]))
    assert f"differs from the sweep already in {cfg.sweep_dir}" in str(e.value)
