"""Replicates (sweep.seeds): one trial runs every stage once per training seed, reports the
mean to Tune (what Optuna and ASHA see), records each seed's scores in MLflow, and a trial
interrupted between replicates resumes with the unfinished ones only. The trial function
runs in-process with its stages replaced by fakes (no Ray Train): what is under test is the
bookkeeping around them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray.tune

from vlp.platform.sweep import load_sweep_config
from vlp.platform.sweep import trial as trial_mod
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.sweep.trial import TrialContext, run_trial
from vlp.platform.tracking.mlflow_run import MlflowRun

from tune_capture import FakeTune

CONFIG = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "sweep-tiny.yaml"
POINT = TrialPoint.of({"mlm": 1, "itm": 1})


def fake_scores(bench: str, seed: int) -> dict[str, float]:
    return {"retrieval": {"ir": 10.0 + seed, "tr": 20.0 + 3 * seed},
            "vqa": {"vqa": 40.0 - 2 * seed}}[bench]


class Stages:
    """Fake stages: record every (stage, seed) run; optionally fail once at one of them."""

    def __init__(self, fail_at: tuple[str, int] | None = None):
        self.calls: list[tuple[str, int]] = []
        self.fail_at = fail_at

    def pretrain(self, ctx, point, name, trial_dir, run_id, rep):
        self.calls.append(("pretrain", rep.seed))
        rep.checkpoint, rep.steps, rep.pretrain_loss = f"/ckpt/{name}", 4, 1.0 + rep.seed

    def finetune(self, ctx, point, name, trial_dir, run_id, bench, rep, group=None):
        if self.fail_at == (bench, rep.seed):
            self.fail_at = None
            raise RuntimeError("worker lost")
        self.calls.append((bench, rep.seed))
        assert name.endswith(f"-seed{rep.seed}") and rep.checkpoint == f"/ckpt/{name}"
        rep.scores.update(fake_scores(bench, rep.seed))
        rep.steps += 2


@pytest.fixture
def setup(tmp_path, monkeypatch):
    cfg = load_sweep_config(CONFIG, [f"world={tmp_path / 'world'}", f"sweep.output_dir={tmp_path}",
                                     "sweep.seeds=3"]).resolved()
    parent = MlflowRun.open(cfg.mlflow.tracking_uri, cfg.mlflow.experiment, run_name="s",
                            tags={"vlp.job": "sweep"})
    ctx = TrialContext(cfg, parent.run_id, "inst", str(tmp_path / "trials"))
    tune = FakeTune(tmp_path / "tune")
    monkeypatch.setattr(ray.tune, "report", tune.report)
    monkeypatch.setattr(ray.tune, "get_checkpoint", tune.get_checkpoint)
    return ctx, tune


def trial_runs(ctx: TrialContext) -> dict[str, list[str]]:
    """trial → the ids of its MLflow runs under the sweep's parent (a list: a second run for
    the same trial after a restore shows as two, where a dict by trial would keep one)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(ctx.cfg.mlflow.tracking_uri)
    exp = client.get_run(ctx.parent_run_id).info.experiment_id
    out: dict[str, list[str]] = {}
    for r in client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{ctx.parent_run_id}'"):
        out.setdefault(r.data.tags["vlp.sweep.trial"], []).append(r.info.run_id)
    return out


def run_with(stages: Stages, ctx: TrialContext, monkeypatch) -> None:
    monkeypatch.setattr(trial_mod, "_pretrain", stages.pretrain)
    monkeypatch.setattr(trial_mod, "_finetune", stages.finetune)
    run_trial({"point": POINT.to_params(), "trial_number": 0}, ctx)


def test_k_seeds_run_every_stage_k_times_and_report_the_mean(setup, monkeypatch):
    from mlflow.tracking import MlflowClient

    ctx, tune = setup
    stages = Stages()
    run_with(stages, ctx, monkeypatch)
    assert stages.calls == [("pretrain", 0), ("pretrain", 1), ("pretrain", 2),
                            ("retrieval", 0), ("retrieval", 1), ("retrieval", 2),
                            ("vqa", 0), ("vqa", 1), ("vqa", 2)]
    assert [r["stage"] for r in tune.reports] == [0, 1, 2]
    # Tune (Optuna's objective, ASHA's rungs) sees the mean over the seeds at each stage
    ir, tr, vqa = 11.0, 23.0, 38.0        # means of 10+s, 20+3s, 40-2s over s = 0, 1, 2
    assert tune.reports[1]["score"] == pytest.approx(ir + tr)
    assert tune.reports[2]["score"] == pytest.approx(ir + tr + vqa)
    assert tune.reports[2]["vqa"] == pytest.approx(vqa) and tune.reports[2]["seeds"] == 3
    assert tune.reports[2]["trial_steps"] == 3 * (4 + 2 + 2)
    assert tune.reports[0]["pretrain_loss"] == pytest.approx(2.0)
    # MLflow: the trial's run holds the means and K finetune sets (one per seed)
    run = MlflowClient(ctx.cfg.mlflow.tracking_uri).get_run(tune.reports[-1]["mlflow_run_id"])
    m = run.data.metrics
    assert m["score"] == pytest.approx(ir + tr + vqa) and run.info.status == "FINISHED"
    for seed in (0, 1, 2):
        for part, value in {**fake_scores("retrieval", seed), **fake_scores("vqa", seed)}.items():
            assert m[f"seed{seed}.{part}"] == value
    assert not any(k.startswith("seed3.") for k in m)


def test_restore_after_an_interrupted_replicate_reruns_only_that_replicate(setup, monkeypatch):
    ctx, tune = setup
    first = Stages(fail_at=("retrieval", 1))
    with pytest.raises(RuntimeError, match="worker lost"):
        run_with(first, ctx, monkeypatch)
    assert first.calls == [("pretrain", 0), ("pretrain", 1), ("pretrain", 2), ("retrieval", 0)]
    assert [r["stage"] for r in tune.reports] == [0]      # Tune's last checkpoint: stage 0
    saved = json.loads((Path(ctx.trials_dir) / "t001" / "replicates.json").read_text())
    assert [r["done"] for r in saved["replicates"]] == [1, 0, 0]
    second = Stages()
    run_with(second, ctx, monkeypatch)                   # Tuner.restore: the same trial again
    # no pretraining again, and seed 0's finished retrieval is not rerun
    assert second.calls == [("retrieval", 1), ("retrieval", 2), ("vqa", 0), ("vqa", 1),
                            ("vqa", 2)]
    assert tune.reports[-1]["score"] == pytest.approx(11.0 + 23.0 + 38.0)
    attempts = (Path(ctx.trials_dir) / "t001" / "attempts.jsonl").read_text().splitlines()
    assert [json.loads(a)["resumed_after_stage"] for a in attempts] == [-1, 0]
    # the restored trial goes on in its one MLflow run, the one Tune's reports name
    assert trial_runs(ctx) == {"t001": [tune.reports[-1]["mlflow_run_id"]]}


def test_a_stage_finished_after_tunes_last_checkpoint_is_not_run_again(setup, monkeypatch):
    """Stopped after stage 0 finished but before Tune saved its report's checkpoint (a
    Ctrl-C between the two): the replicates file holds stage 0, and the restored trial goes
    on from there."""
    ctx, tune = setup
    first = Stages(fail_at=("retrieval", 0))
    with pytest.raises(RuntimeError, match="worker lost"):
        run_with(first, ctx, monkeypatch)
    tune.checkpoint = None                              # the stage-0 save never happened
    second = Stages()
    run_with(second, ctx, monkeypatch)
    assert second.calls == [("retrieval", 0), ("retrieval", 1), ("retrieval", 2),
                            ("vqa", 0), ("vqa", 1), ("vqa", 2)]     # no pretraining again
    assert trial_runs(ctx) == {"t001": [tune.reports[-1]["mlflow_run_id"]]}


def test_include_seeds_replicate_the_named_include_points_only(tmp_path):
    from vlp.contract.config_loader import ConfigError
    from vlp.platform.sweep.preflight import SweepPlan
    from vlp.platform.sweep.run import _summary  # noqa: F401  (the plan's wording)

    cfg = load_sweep_config(CONFIG, [f"world={tmp_path}", "sweep.include_seeds={none: 3}"])
    plan = SweepPlan(first=(("none", TrialPoint()), ("paper-best", POINT)))
    ctx = TrialContext(cfg, "p", "i", str(tmp_path),
                       include_seeds={p.key(): cfg.sweep.include_seeds[n]
                                      for n, p in plan.first if n in cfg.sweep.include_seeds})
    assert ctx.seeds_for(TrialPoint()) == [0, 1, 2]
    assert ctx.seeds_for(POINT) == [0]
    with pytest.raises(ConfigError, match="sweep.include_seeds.mlm.*not an include point"):
        load_sweep_config(CONFIG, [f"world={tmp_path}", "sweep.include_seeds={mlm: 2}"])
    with pytest.raises(ConfigError, match="lists none more than once"):
        load_sweep_config(CONFIG, [f"world={tmp_path}", "sweep.include=[none,none]"])


def test_a_checkpoint_from_before_replicates_resumes_as_one_replicate(setup, monkeypatch,
                                                                      tmp_path):
    ctx, tune = setup
    ctx.cfg.sweep.seeds = 1
    old = tmp_path / "old-ckpt"
    old.mkdir()
    (old / "sweep_trial.json").write_text(json.dumps({
        "done": 1, "checkpoint": "/ckpt/t001", "scores": {"ir": 10.0, "tr": 20.0},
        "steps": 6, "seconds": 1.0, "pretrain_loss": 1.0, "mlflow_run_id": None}))
    tune.checkpoint = ray.tune.Checkpoint.from_directory(str(old))
    stages = Stages()
    stages.finetune = lambda ctx, point, name, trial_dir, run_id, bench, rep, group=None: (
        stages.calls.append((bench, rep.seed)), rep.scores.update({"vqa": 40.0}))
    run_with(stages, ctx, monkeypatch)
    assert stages.calls == [("vqa", 0)]
    assert tune.reports[-1]["score"] == pytest.approx(70.0)
