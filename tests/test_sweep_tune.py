"""How a sweep is handed to Ray Tune (no cluster): OptunaSearch + ASHA on the stage index
for a search, a grid over the named lines for a replay, resources per trial, and what a
trial reports after each stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlp.platform.sweep import load_sweep_config
from vlp.platform.sweep.preflight import SweepPlan
from vlp.platform.sweep.replays import replay_lines
from vlp.platform.sweep.run import _param_space, _tune_config, trial_cpus, trial_gpus
from vlp.platform.sweep.trial_records import result_metrics
from vlp.platform.sweep.trial_state import TrialState

CONFIGS = Path(__file__).resolve().parents[1] / "jobs" / "configs"


def test_search_is_seeded_tpe_with_asha_on_the_stage():
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    cfg = load_sweep_config(CONFIGS / "sweep-demo.yaml", ["sweep.seed=7"])
    tc = _tune_config(cfg, SweepPlan(), concurrency=2)
    assert isinstance(tc.search_alg, OptunaSearch) and isinstance(tc.scheduler, ASHAScheduler)
    assert (tc.metric, tc.mode, tc.num_samples, tc.max_concurrent_trials) == ("score", "max", 3, 2)
    assert tc.scheduler._time_attr == "stage" and tc.scheduler._max_t == 4
    assert _param_space(SweepPlan()) == {}


def test_the_search_is_reproducible_for_a_seed():
    cfg = load_sweep_config(CONFIGS / "sweep-demo.yaml", ["sweep.include=[]",
                                                          "sweep.include_seeds={}"])

    def first(seed: int) -> list[dict]:
        cfg.sweep.seed = seed
        search = _tune_config(cfg, SweepPlan(), concurrency=1).search_alg
        return [search.suggest(f"trial{i}")["point"] for i in range(3)]

    assert first(3) == first(3) != first(4)


def test_replay_is_a_grid_over_the_lines_without_early_stopping():
    from ray.tune.schedulers import FIFOScheduler

    cfg = load_sweep_config(CONFIGS / "table3-demo.yaml")
    plan = SweepPlan(lines=tuple((l.name, l.point) for l in replay_lines("table3")))
    space = _param_space(plan)
    assert space["line"]["grid_search"] == [f"L{i:02d}" for i in range(1, 14)]
    tc = _tune_config(cfg, plan, concurrency=1)
    assert isinstance(tc.scheduler, FIFOScheduler) and tc.search_alg is None


def test_resources_per_trial():
    tiny = load_sweep_config(CONFIGS / "sweep-tiny.yaml")
    assert trial_cpus(tiny) == 2.0 and trial_gpus(tiny) == 0.0
    base = load_sweep_config(CONFIGS / "table3-uniter-base.yaml")
    assert trial_cpus(base) == 8 * 4 + 1 and trial_gpus(base) == 8


def test_a_trial_reports_the_meta_sum_parts_so_far():
    state = TrialState(done=2, scores={"vqa": 40.0, "ir": 10.0, "tr": 12.0}, steps=900,
                       seconds=30.0, mlflow_run_id="r")
    m = result_metrics(state, 2, 4)
    assert (m["stage"], m["stages"], m["score"], m["trial_steps"]) == (2, 4, 62.0, 900)
    assert "meta_sum" not in m
    state.scores.update({"nlvr2": 55.0, "refcoco+": 50.0})
    m = result_metrics(state, 4, 4)
    assert m["meta_sum"] == pytest.approx(167.0) == m["score"]
    assert m["refcoco_plus"] == 50.0 and "refcoco+" not in m      # MLflow-safe key


def test_a_repeat_proposal_is_not_a_trial(tmp_path):
    """A two-point space (no pretraining, MLM alone): the search hands out each point once,
    numbered by distinct point, turns repeats away as PRUNED, then ends as exhausted."""
    from optuna.trial import TrialState as OptunaState
    from ray.tune.search import Searcher

    from vlp.platform.sweep.distinct_search import space_exhausted
    from vlp.platform.sweep.point import TrialPoint
    from vlp.platform.sweep.run import EXHAUSTED_FILE

    cfg = load_sweep_config(CONFIGS / "sweep-demo.yaml", [
        f"sweep.output_dir={tmp_path}", "sweep.include=[none]", "sweep.num_samples=4",
        "space.tasks=[mlm]", "space.ratios=[1]", "space.masking=[conditional]",
        "space.data=[in]", "sweep.tpe_startup=1"]).resolved()
    search = _tune_config(cfg, SweepPlan(first=(("none", TrialPoint()),)), 1).search_alg
    first = search.suggest("a")
    assert TrialPoint.from_params(first["point"]) == TrialPoint() and first["trial_number"] == 0
    search.on_trial_complete("a", {"score": 10.0})
    second = search.suggest("b")
    assert TrialPoint.from_params(second["point"]) == TrialPoint.of({"mlm": 1})
    assert second["trial_number"] == 1
    search.on_trial_complete("b", {"score": 20.0})
    before = search.redraws                  # repeats turned away while finding the second
    assert search.suggest("c") == Searcher.FINISHED           # only repeats are left
    assert search.redraws - before == 51
    states = [t.state for t in search._ot_study.trials]
    assert states.count(OptunaState.COMPLETE) == 2
    assert states.count(OptunaState.PRUNED) == search.redraws == len(states) - 2
    marker = cfg.sweep_dir / EXHAUSTED_FILE
    assert space_exhausted(marker).startswith("2 distinct points")


def test_asha_keeps_its_rungs_across_a_restore(tmp_path):
    """Tune restores the scheduler pickled with the Tuner at the start; the rungs recorded
    since come from the sweep folder's file (the whole sweep: test_sweep_asha.py)."""
    import pickle
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from vlp.platform.sweep.asha import STATE_FILE

    cfg = load_sweep_config(CONFIGS / "sweep-tiny.yaml", [f"sweep.output_dir={tmp_path}"])
    asha = _tune_config(cfg, SweepPlan(), concurrency=1).scheduler
    assert asha.storage.root == cfg.sweep_storage().root
    asha.set_search_properties("score", "max")
    at_start = pickle.dumps(asha)              # what Tuner.restore unpickles
    first, second = SimpleNamespace(trial_id="a"), SimpleNamespace(trial_id="b")
    asha.on_trial_add(None, first)
    assert asha.on_trial_result(None, first, {"stage": 1, "score": 90.0}) == \
        TrialScheduler.CONTINUE
    restored = pickle.loads(at_start)
    restored.on_trial_add(None, second)
    assert restored.on_trial_result(None, second, {"stage": 1, "score": 10.0}) == \
        TrialScheduler.STOP
    assert cfg.sweep_storage().exists(STATE_FILE)
