"""The task sampler: same draws for the same seed, exact resume, ratios, clear errors."""

from __future__ import annotations

import collections

import pytest

from vlp.datasets.stream.data_config import DataConfigError
from vlp.datasets.batching.task_sampler import TaskSampler

UNITER_MIX = {"itm": 2, "mlm": 2, "mrfr": 1, "mrc-kl": 1}


def test_the_same_seed_gives_the_same_draws():
    # (that every rank of a real 2-worker run draws the same tasks is checked on the lists
    # the ranks record: test_pretrain_train.py)
    ranks = [TaskSampler(UNITER_MIX, seed=7) for _ in range(4)]
    draws = [[s.next() for _ in range(500)] for s in ranks]
    assert all(d == draws[0] for d in draws)
    assert draws[0] != [s for s in (TaskSampler(UNITER_MIX, seed=8).next() for _ in range(500))]


def test_ratios_followed():
    s = TaskSampler(UNITER_MIX, seed=0)
    counts = collections.Counter(s.next() for _ in range(12000))
    for task, r in UNITER_MIX.items():
        assert abs(counts[task] / 12000 - r / 6) < 0.015, (task, counts)


def test_zero_ratio_never_drawn():
    s = TaskSampler({"mlm": 1, "itm": 0}, seed=0)
    assert s.tasks == ["mlm"] and {s.next() for _ in range(100)} == {"mlm"}


def test_resume_exactly_from_state():
    a = TaskSampler(UNITER_MIX, seed=3)
    [a.next() for _ in range(137)]
    state = a.state_dict()
    assert all(isinstance(v, (int, dict)) for v in state.values())   # torch.load-safe
    expected = [a.next() for _ in range(200)]
    b = TaskSampler(UNITER_MIX, seed=3)
    b.load_state_dict(state)
    assert [b.next() for _ in range(200)] == expected
    c = TaskSampler(UNITER_MIX, seed=4)
    with pytest.raises(ValueError, match="different task sequence"):
        c.load_state_dict(state)


@pytest.mark.parametrize("mix, key, text", [
    ({"mlm": 1, "mfrr": 1}, "tasks.mfrr", "unknown task 'mfrr'"),
    ({"mlm": 1, "itm": -1}, "tasks.itm", "ratio ≥ 0"),
    ({"mlm": 0, "itm": 0}, "tasks", "all mix ratios are 0"),
    ({"mlm": float("nan")}, "tasks.mlm", "ratio ≥ 0"),
    ({}, "tasks", "at least one task"),
])
def test_bad_mix_names_the_key(mix, key, text):
    with pytest.raises(DataConfigError) as e:
        TaskSampler(mix, seed=0)
    assert any(k == key and text in m for k, m in e.value.problems), e.value.problems
    assert key in str(e.value)
