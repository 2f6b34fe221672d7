"""The device step's lr (``lr_schedule.device_multiplier``: the schedule as tensor operations,
so that a captured step computes it and a skipped update does not advance it) equals the
float schedule at every step of each kind: linear with warm-up, constant, step with
milestones, and no warm-up."""

from __future__ import annotations

import pytest
import torch

from vlp.platform.training.lr_schedule import WarmupLinearDecay, device_multiplier


@pytest.mark.parametrize("schedule", [
    WarmupLinearDecay(5, 40),
    WarmupLinearDecay(5, 40, decay=False),
    WarmupLinearDecay(3, 40, decay=False, milestones=(10, 25), factor=0.1),
    WarmupLinearDecay(0, 12),
], ids=["linear", "constant", "step", "no-warmup"])
def test_the_device_multiplier_is_the_schedule(schedule):
    for index in range(schedule.total_steps + 3):
        got = device_multiplier(schedule, torch.tensor(float(index)))
        assert got.dtype == torch.float32 and got.dim() == 0
        assert float(got) == pytest.approx(schedule(index), rel=1e-6, abs=1e-9), index
