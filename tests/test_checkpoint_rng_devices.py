"""Checkpoints hold the RNG state of the worker's own GPU, not of every GPU its node has: a
run resumed on a node with fewer GPUs (or at another device index) restores it. Checked on
CPU against a stand-in for ``torch.cuda`` that behaves like torch's on an N-GPU node
(``default_generators[i]`` out of range raises IndexError)."""

from __future__ import annotations

import pytest
import torch

from vlp.platform.training import checkpointing


class FakeCuda:
    """The part of ``torch.cuda`` the RNG code uses, for a node with ``count`` GPUs; each
    generator's state is a distinct byte tensor."""

    def __init__(self, count: int, current: int = 0):
        self.count, self.current = count, current
        self.states = [torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(count)]

    def install(self, monkeypatch) -> None:
        for name in ("is_available", "is_initialized", "device_count", "current_device",
                     "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def device_count(self):
        return self.count

    def current_device(self):
        return self.current

    def _index(self, device) -> int:
        if isinstance(device, int):
            i = device
        else:
            i = torch.device(device).index
            i = self.current if i is None else i
        if i >= self.count:
            raise IndexError("tuple index out of range")   # torch.cuda.default_generators[i]
        return i

    def get_rng_state(self, device="cuda"):
        return self.states[self._index(device)].clone()

    def set_rng_state(self, state, device="cuda"):
        self.states[self._index(device)] = state.clone()

    def get_rng_state_all(self):
        return [self.get_rng_state(i) for i in range(self.count)]

    def set_rng_state_all(self, states):
        for i, s in enumerate(states):       # as torch does: one device per saved state
            self.set_rng_state(s, i)


def saved_on(monkeypatch, count: int, current: int) -> dict:
    node = FakeCuda(count, current)
    node.install(monkeypatch)
    return checkpointing.rng_state()


def test_saves_only_the_workers_own_device(monkeypatch):
    state = saved_on(monkeypatch, count=4, current=2)    # rank on GPU 2 of a 4-GPU node
    assert isinstance(state["cuda"], torch.Tensor)
    assert torch.equal(state["cuda"], torch.full((16,), 12, dtype=torch.uint8))


@pytest.mark.parametrize("count,current", [(1, 0), (2, 1), (8, 5)])
def test_restores_on_a_node_with_any_gpu_count(monkeypatch, count, current):
    state = saved_on(monkeypatch, count=4, current=3)
    node = FakeCuda(count, current)
    node.install(monkeypatch)
    checkpointing.set_rng_state(state)
    assert torch.equal(node.states[current], torch.full((16,), 13, dtype=torch.uint8))
    others = [i for i in range(count) if i != current]
    assert all(node.states[i][0] == 10 + i for i in others)   # other GPUs untouched


def test_old_checkpoints_with_every_gpus_state_restore_too(monkeypatch):
    old = checkpointing.rng_state()                      # CPU parts
    old["cuda"] = [torch.full((16,), 20 + i, dtype=torch.uint8) for i in range(4)]
    node = FakeCuda(1, 0)                                # resumed on a 1-GPU node
    node.install(monkeypatch)
    checkpointing.set_rng_state(old)                     # no IndexError
    assert node.states[0][0] == 20                       # its own index's state
    node = FakeCuda(8, 6)                                # index 6 not in the old list
    node.install(monkeypatch)
    checkpointing.set_rng_state(old)
    assert node.states[6][0] == 16                       # left as seeded


def test_the_cpu_streams_round_trip():
    import random

    import numpy as np

    state = checkpointing.rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    checkpointing.set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
