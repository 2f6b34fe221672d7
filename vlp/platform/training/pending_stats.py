"""A step's statistics on their way to the host, read a few steps late.

Reading the step's statistics (losses, the gradient norm, the skip flag, the cross-rank
checks) at the step that made them makes the host wait for the device's whole step: it then
cannot queue the next step's work while the device computes, and on a GPU that idles the
device for the host's dispatch time every step. ``PendingStats`` copies each step's vector
into a page-locked host buffer with ``non_blocking=True`` and records a CUDA event after the
copy; the vector is read ``lag`` steps later, when the event has long completed, so the read
waits for nothing. ``drain`` reads everything (before a checkpoint and at the end: a wait
there is no loss). On a CPU the copy is an ordinary one and there is no event.

The buffers are plain numpy arrays over the tensors' memory, so the read takes no torch
call (nothing the host-sync recorder, ``vlp.platform.training.host_syncs``, would count), and they are
reused: ``lag + 1`` of them are in use at once.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
import torch


class PendingStats:
    def __init__(self, lag: int):
        if lag < 0:
            raise ValueError(f"lag={lag}: expected 0 or more steps")
        self.lag = lag
        self._queue: collections.deque = collections.deque()
        self._free: list[tuple[torch.Tensor, np.ndarray]] = []

    def __len__(self) -> int:
        return len(self._queue)

    def _buffer(self, n: int, device: torch.device) -> tuple[torch.Tensor, np.ndarray]:
        for i, (host, array) in enumerate(self._free):
            if host.numel() >= n and host.is_pinned() == (device.type == "cuda"):
                return self._free.pop(i)
        size = max(256, 1 << (n - 1).bit_length())
        if device.type == "cuda":
            host = torch.empty(size, dtype=torch.float64, pin_memory=True)
            return host, host.numpy()
        array = np.empty(size, dtype=np.float64)
        return torch.from_numpy(array), array

    def push(self, vec: torch.Tensor, meta: Any) -> None:
        """Start the copy of ``vec`` (1-D, float64) to the host; ``meta`` comes back with it."""
        n = vec.numel()
        host, array = self._buffer(n, vec.device)
        host[:n].copy_(vec, non_blocking=True)
        event = None
        if vec.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        self._queue.append((host, array, n, event, meta))

    def ready(self) -> list[tuple[list[float], Any]]:
        """(values, meta) of the vectors pushed more than ``lag`` pushes ago, oldest first."""
        out = []
        while len(self._queue) > self.lag:
            out.append(self._read())
        return out

    def drain(self) -> list[tuple[list[float], Any]]:
        """Every pushed vector, oldest first (waits for the device where it must)."""
        out = []
        while self._queue:
            out.append(self._read())
        return out

    def _read(self) -> tuple[list[float], Any]:
        host, array, n, event, meta = self._queue.popleft()
        if event is not None:
            event.synchronize()     # completed `lag` steps ago: returns at once
        values = array[:n].tolist()
        self._free.append((host, array))
        return values, meta
