"""The sweep and the Table 3 replay under both objectives: a space may vary the objective
(each point then names its own, and under ``summed`` its mix ratios are the loss weights), a
point without one keeps its key and runs at the family's paper's objective, and a replay runs
at ``pretrain.train.objective`` (else the family's)."""

from __future__ import annotations

import hashlib
import json

from vlp.platform.sweep import SearchSpace, TrialPoint
from vlp.platform.sweep.preflight import check_sweep
from vlp.platform.sweep.trial_configs import configs_of, pretrain_config

from test_sweep_preflight import load
from test_sweep_space import _sample


def test_a_space_over_both_objectives_samples_each_and_warm_starts_exactly():
    space = SearchSpace(tasks=["mlm", "itm", "mrfr"], ratios=[1, 2], no_pretraining=False,
                        objective=["sampled", "summed"])
    points = _sample(space, 40)
    assert {p.objective for p in points} == {"sampled", "summed"}
    assert all(not space.problems_with(p, "p") for p in points)
    p = TrialPoint.of({"mlm": 2, "itm": 1}, objective="summed")
    assert space.params_for(p)["objective"] == "summed"
    assert TrialPoint.from_params(p.to_params()) == p
    assert "loss weights" in p.describe() and p.tags()["objective"] == "summed"
    assert SearchSpace(objective=["sampled"]).problems_with(p, "p")   # outside the space


def test_a_point_without_an_objective_keeps_its_key_and_params():
    p = TrialPoint.of({"mlm": 2, "itm": 2})
    assert "objective" not in p.to_params() and "objective" not in p.tags()
    before = {"tasks": {"mlm": 2.0, "itm": 2.0}, "masking": "conditional", "data": "in",
              "init": "random"}         # what a point was keyed by before objectives
    assert p.key() == hashlib.sha1(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert p.key() != TrialPoint.of({"mlm": 2, "itm": 2}, objective="summed").key()


def test_a_summed_point_pretrains_with_its_ratios_as_loss_weights(tiny_world, tmp_path):
    cfg = load(tiny_world, tmp_path)
    point = TrialPoint.of({"mlm": 2, "itm": 2, "mrfr": 1}, objective="summed")
    exp = pretrain_config(cfg, point, trial="t", trial_dir=str(tmp_path / "t"))
    assert exp.train.objective == "summed" and exp.tasks == {"mlm": 2, "itm": 2, "mrfr": 1}
    plain = pretrain_config(cfg, TrialPoint.of({"mlm": 1}), trial="u",
                            trial_dir=str(tmp_path / "u"))
    assert plain.train.objective == ""           # the family's (uniter-tiny: sampled)


def test_the_table3_replay_runs_at_either_objective(tiny_world, tmp_path):
    for objective, expected in (("", ""), ("summed", "summed"), ("sampled", "sampled")):
        extra = [f"pretrain.train.objective={objective}"] if objective else []
        cfg = load(tiny_world, tmp_path, "sweep.replay=table3", *extra)
        plan = check_sweep(cfg)
        exps = [e for _, _, e in configs_of(cfg, list(plan.lines)) if e is not None]
        assert len(exps) == 11 and {e.train.objective for e in exps} == {expected}


def test_a_search_over_objectives_checks_a_config_of_each_before_any_trial(tiny_world,
                                                                        tmp_path):
    plan = check_sweep(load(tiny_world, tmp_path, "space.objective=[sampled,summed]"))
    best = dict(plan.first)["paper-best"]
    assert best.objective == "sampled"        # the space's first: a named point in the space
