"""``EpochSampler``: a rank's share of a shuffled epoch, batch by batch, resumable exactly.

Epoch e is a permutation drawn from (seed, e) — the same on every rank — and rank r takes
every world-th index of it, so the ranks' shares are disjoint. The state is two integers.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class EpochSampler:
    def __init__(self, n: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        if n < world_size:
            raise ValueError(f"{n} training examples cannot be shared by {world_size} workers")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.rank, self.world = rank, world_size
        self.epoch, self.pos = 0, 0
        self._order = self._epoch_order()

    def _epoch_order(self) -> np.ndarray:
        perm = np.random.default_rng([self.seed, self.epoch, 0xD0C]).permutation(self.n)
        share = perm[self.rank::self.world]
        return share[: self.n // self.world]    # equal shares: equal batches per epoch

    def next(self) -> np.ndarray:
        """Indices of the next batch (an epoch's last batch may be smaller)."""
        if self.pos >= len(self._order):
            self.epoch, self.pos = self.epoch + 1, 0
            self._order = self._epoch_order()
        idx = self._order[self.pos:self.pos + self.batch_size]
        self.pos += len(idx)
        return idx

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self._order = self._epoch_order()
