"""The sweep's search space: structure checks, fit to the model family (registry), the
Optuna define-by-run sampler's constraints, warm-start params, replays and points."""

from __future__ import annotations

import pytest

from vlp.contract.config_loader import ConfigError
from vlp.platform.sweep import SearchSpace, TrialPoint, check_space, load_sweep_config
from vlp.platform.sweep.replays import check_replay, named_point, replay_lines
from vlp.platform.sweep.space import SpaceSampler


def problems_of(space: SearchSpace) -> list[tuple[str, str]]:
    return list(space.validate())


# ---- structure ----------------------------------------------------------------------------------

def test_empty_space_is_an_error():
    (key, msg), = problems_of(SearchSpace(tasks=[], no_pretraining=False))
    assert key == "tasks" and "the space is empty" in msg


def test_empty_choice_lists_and_duplicates_are_errors():
    found = dict(problems_of(SearchSpace(tasks=["mlm", "mlm"], ratios=[], masking=[])))
    assert "more than once" in found["tasks"] and "mlm" in found["tasks"]
    assert "is empty" in found["ratios"] and "is empty" in found["masking"]


def test_only_no_pretraining_is_a_valid_space():
    assert problems_of(SearchSpace(tasks=[], no_pretraining=True)) == []


def test_bad_values_are_named_on_load():
    with pytest.raises(ConfigError) as e:
        load_sweep_config(data={"world": "w", "space": {"masking": ["conditonal"],
                                                         "ratios": [0], "data": ["web"]}})
    keys = {k.split(".")[1] for k, _ in e.value.problems}
    assert keys == {"masking", "ratios", "data"}


# ---- the family registry ------------------------------------------------------------------------

def test_region_tasks_need_a_region_family():
    (key, msg), = check_space(SearchSpace(tasks=["mlm", "mrc"], init=["random"]), "soho-tiny")
    assert key == "space.tasks.1"
    assert "does not apply to soho-tiny" in msg and "reads pixels" in msg


def test_mvm_only_for_soho_and_vlbert_tasks_only_for_vlbert():
    found = dict(check_space(SearchSpace(tasks=["mlm", "mvm", "mrc-vlbert", "moc"]),
                             "uniter-tiny"))
    assert set(found) == {"space.tasks.1", "space.tasks.2", "space.tasks.3"}
    assert "a task of soho" in found["space.tasks.1"]
    assert "a task of vlbert" in found["space.tasks.2"]
    assert "imagebert" in found["space.tasks.3"]
    assert check_space(SearchSpace(tasks=["mlm", "itm", "mvm"]), "soho-tiny") == []


def test_unknown_task_suggests_the_close_name():
    (key, msg), = check_space(SearchSpace(tasks=["mlm", "mrc_kl"]), "uniter-tiny")
    assert key == "space.tasks.1" and "unknown task 'mrc_kl'" in msg and "'mrc-kl'" in msg


def test_text_init_must_fit_the_family():
    (key, msg), = check_space(SearchSpace(init=["random", "text"]), "uniter-tiny",
                              text_init="minilm")
    assert key == "space.init" and "uniter-minilm" in msg
    assert check_space(SearchSpace(init=["random", "text"]), "uniter-minilm") == []
    # auto: MiniLM where it fits, else text-only weights trained on the world's captions
    assert check_space(SearchSpace(init=["random", "text"]), "uniter-tiny") == []
    (key, msg), = check_space(SearchSpace(init=["text"]), "uniter-base",
                              text_init="bert:/no/such/bert")
    assert "names no file or folder" in msg


# ---- replays ------------------------------------------------------------------------------------

def test_table3_has_the_papers_13_lines():
    lines = replay_lines("table3")
    assert [l.name for l in lines] == [f"L{i:02d}" for i in range(1, 14)]
    labels = [l.point.mix_label() for l in lines]
    assert labels[0] == "None" and labels[1] == "MLM (text only)"
    assert labels[2:6] == ["MRFR", "ITM", "MLM", "MLM+ITM"]
    assert labels[9] == "MLM+ITM+MRC-kl+MRFR"
    assert labels[10] == "MLM+ITM+MRC-kl+MRFR (w/o cond. mask)"
    assert [l.point.data for l in lines[9:]] == ["in", "in", "out", "both"]
    assert not lines[0].point.pretrains and lines[1].point.init == "text"
    assert all(l.point.init == "text" for l in lines[2:])


def test_replay_checks_name_and_family():
    (key, msg), = check_replay("tabel3", "uniter-minilm")
    assert key == "sweep.replay" and "did you mean 'table3'" in msg
    assert check_replay("table3", "uniter-minilm") == []
    found = [m for _, m in check_replay("table3", "vlbert-minilm")]
    assert any("'mrfr' does not apply to vlbert-minilm" in m and "L03" in m for m in found)
    assert any("'mrc-kl'" in m and "L09, L10, L11, L12, L13" in m for m in found)
    assert check_replay("table3", "uniter-tiny") == []          # auto: world-text weights
    found = [m for _, m in check_replay("table3", "uniter-tiny", text_init="minilm")]
    assert len(found) == 1 and "text init 'minilm'" in found[0] and "L02" in found[0]


# ---- the Optuna sampler -------------------------------------------------------------------------

def _sample(space: SearchSpace, n: int, seed: int = 0) -> list[TrialPoint]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.RandomSampler(seed=seed))
    sampler, out = SpaceSampler(space), []
    for _ in range(n):
        trial = study.ask()
        cfg = sampler(trial)
        out.append(TrialPoint.from_params(cfg["point"]))
        assert cfg["trial_number"] == trial.number
        study.tell(trial, 0.0)
    return out


def test_sampler_respects_at_least_one_task():
    space = SearchSpace(tasks=["mlm", "itm", "mrfr"], ratios=[1, 2], no_pretraining=False)
    points = _sample(space, 80)
    assert all(p.pretrains for p in points)
    assert all(set(p.mix) <= {"mlm", "itm", "mrfr"} for p in points)
    assert all(set(p.mix.values()) <= {1.0, 2.0} for p in points)
    assert {p.data for p in points} == {"in", "out", "both"}
    assert len({p.key() for p in points}) > 20      # it explores


def test_sampler_can_draw_no_pretraining_when_allowed():
    points = _sample(SearchSpace(tasks=["mlm"], ratios=[1]), 30)
    assert {p.pretrains for p in points} == {True, False}


def test_params_for_warm_starts_exactly_that_point():
    import optuna

    space = SearchSpace(tasks=["mlm", "itm", "mrc-kl", "mrfr"], ratios=[1, 2],
                        masking=["conditional", "joint"], init=["random"], no_pretraining=False)
    wanted = [named_point("paper-best", "random"), TrialPoint.of({"mrfr": 2}, data="out"),
              TrialPoint.of({"itm": 1}, masking="joint")]
    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=0))
    for p in wanted:
        assert space.problems_with(p, "p") == []
        study.enqueue_trial(space.params_for(p))
    got = []
    for _ in wanted:
        trial = study.ask()
        got.append(TrialPoint.from_params(SpaceSampler(space)(trial)["point"]))
        study.tell(trial, 1.0)
    assert got == wanted


def test_points_outside_the_space_are_named():
    space = SearchSpace(tasks=["mlm", "itm"], ratios=[1], masking=["joint"], data=["in"],
                        no_pretraining=False)
    why = space.problems_with(named_point("paper-best", "random"), "paper-best")
    assert any("mrc-kl, mrfr" in w for w in why)
    assert any("ratio(s) 2" in w for w in why)
    assert any("conditional masking" in w for w in why)
    assert space.problems_with(TrialPoint(), "none") == [
        "none has no pretraining, but space.no_pretraining is false"]


def test_point_labels_and_keys():
    p = TrialPoint.of({"mrfr": 1, "mrc-kl": 1, "itm": 2, "mlm": 2, "mrc": 0})
    assert p.mix_label() == "MLM+ITM+MRC-kl+MRFR" and p.ratio_label() == "2:2:1:1"
    assert p.tags()["mix"] == "MLM+ITM+MRC-kl+MRFR"
    assert TrialPoint.from_params(p.to_params()) == p
    # masking and data mean nothing without pretraining: the same point
    assert TrialPoint(masking="joint", data="out").key() == TrialPoint().key()
    assert TrialPoint(init="text").key() != TrialPoint().key()
