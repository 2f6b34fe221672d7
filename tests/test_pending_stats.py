"""``PendingStats``: each step's vector comes back ``lag`` pushes later, in order, with its
metadata; ``drain`` returns the rest; the host buffers are reused; reading takes no torch
call that the host-sync recorder counts."""

from __future__ import annotations

import pytest
import torch

from vlp.platform.training.pending_stats import PendingStats
from vlp.platform.training.host_syncs import HostSyncRecorder


def test_vectors_come_back_lag_steps_late_in_order_and_drain_returns_the_rest():
    pending = PendingStats(lag=2)
    got = []
    with HostSyncRecorder() as syncs:
        for step in range(5):
            vec = torch.arange(3, dtype=torch.float64) + 10 * step
            pending.push(vec, {"step": step})
            vec.add_(1000)   # the copy was taken at the push
            got.append(pending.ready())
    assert not syncs.events, syncs.describe()
    assert [[m["step"] for _, m in r] for r in got] == [[], [], [0], [1], [2]]
    assert got[3][0][0] == [10.0, 11.0, 12.0]
    assert [m["step"] for _, m in pending.drain()] == [3, 4] and len(pending) == 0
    # three buffers in use at most (lag + 1), reused afterwards
    assert len(pending._free) == 3
    pending.push(torch.zeros(500, dtype=torch.float64), None)   # a longer vector: its own
    assert pending.drain()[0][0] == [0.0] * 500


def test_lag_zero_reads_at_once():
    pending = PendingStats(lag=0)
    pending.push(torch.ones(2, dtype=torch.float64), "m")
    assert pending.ready() == [([1.0, 1.0], "m")]
    with pytest.raises(ValueError, match="lag=-1"):
        PendingStats(lag=-1)
