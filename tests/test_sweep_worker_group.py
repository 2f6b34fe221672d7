"""A sweep trial runs all its finetunes (every stage, every seed) on one kept worker group,
and a finetune on a kept group is the finetune a Ray Train run of its own gives.

Real parts: the session's local Ray, the real loop and DeepSpeed engine, real MLflow (the
sweep's embedded store); only Tune's report is captured (a trial function outside Tune)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import ray.tune

from vlp.platform.sweep import load_sweep_config
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.sweep.trial import TrialContext, run_trial
from vlp.platform.tracking.mlflow_run import MlflowRun

from tune_capture import FakeTune

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

CONFIG = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "sweep-tiny.yaml"
WORKER_CLASSES = ("RayTrainWorker", "GroupWorker")    # a Ray Train worker, a kept group's


def training_workers() -> dict[str, str]:
    """Every training worker actor this Ray has started (alive or dead): id → state."""
    import ray
    from ray.util.state import list_actors

    found = list_actors(address=ray.get_runtime_context().gcs_address, limit=10_000,
                        raise_on_missing_output=False)
    return {a.actor_id: a.state for a in found if a.class_name in WORKER_CLASSES}


def test_a_trial_runs_its_finetunes_on_one_worker_group(ray_local, tiny_world, tmp_path,
                                                        monkeypatch):
    cfg = load_sweep_config(CONFIG, [f"world={tiny_world}", f"sweep.output_dir={tmp_path}",
                                     "sweep.seeds=1"]).resolved()
    parent = MlflowRun.open(cfg.mlflow.tracking_uri, cfg.mlflow.experiment, run_name="s",
                            tags={"vlp.job": "sweep"})
    ctx = TrialContext(cfg, parent.run_id, "inst", str(tmp_path / "trials"))
    tune = FakeTune(tmp_path / "tune")
    monkeypatch.setattr(ray.tune, "report", tune.report)
    monkeypatch.setattr(ray.tune, "get_checkpoint", tune.get_checkpoint)
    before = training_workers()

    run_trial({"point": TrialPoint().to_params(), "trial_number": 0}, ctx)   # no pretraining

    started = {k: v for k, v in training_workers().items() if k not in before}
    benchmarks = list(cfg.finetune.benchmarks)
    # 2 finetune stages: one worker (finetune.num_workers), not one per stage
    assert len(started) == cfg.finetune.num_workers == 1, started
    assert set(started.values()) == {"DEAD"}          # the trial ended its group
    assert [r["stage"] for r in tune.reports] == [0, 1, 2]
    last = tune.reports[-1]
    assert last["seeds"] == 1 and math.isfinite(last["score"])
    for bench in benchmarks:            # each finetune is still a run of its own, checkpointed
        run = tmp_path / "trials" / "t001" / f"t001-ft-{bench}"
        assert list(run.glob("checkpoint_*/vlp_trainer.json")), run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cfg.mlflow.tracking_uri)
    runs = client.search_runs([client.get_run(parent.run_id).info.experiment_id],
                              "tags.`vlp.job` = 'finetune'")
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FINISHED"}


def test_a_finetune_on_a_kept_group_scores_as_on_ray_train(ray_local, tiny_world, tmp_path):
    """The same finetune (seed, steps, data) on its own Ray Train run and on a kept group
    that has run another finetune first: the same metrics, to the last digit."""
    from vlp.platform.finetune import finetune_and_evaluate
    from vlp.platform.training.worker_group import WorkerGroup

    kw = dict(world=str(tiny_world), family="uniter-tiny", seed=3, mlflow=False,
              overrides=["settings.vqa.steps=3", "settings.vqa.batch_size=8",
                         "settings.retrieval.steps=2", "settings.retrieval.batch_size=8",
                         "eval.batch_size=256"])
    alone = finetune_and_evaluate(None, ["vqa"], run_name="alone",
                                  output_dir=str(tmp_path / "alone"), **kw)
    with WorkerGroup() as group:
        finetune_and_evaluate(None, ["retrieval"], run_name="first",
                              output_dir=str(tmp_path / "kept"), group=group, **kw)
        kept = finetune_and_evaluate(None, ["vqa"], run_name="second",
                                     output_dir=str(tmp_path / "kept"), group=group, **kw)
        assert group.starts == 1 and len(group.pids) == 1
    assert kept.benchmarks["vqa"].metrics == alone.benchmarks["vqa"].metrics
    assert kept.scores == alone.scores
    assert list((tmp_path / "kept" / "second-vqa").glob("checkpoint_*/vlp_trainer.json"))
