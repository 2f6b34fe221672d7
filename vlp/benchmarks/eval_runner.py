"""Evaluation spread over the training workers: each rank scores its shard of the queries,
rank 0 gathers the shards and computes the metric.

Shards are contiguous blocks of the query order (``np.array_split``), so concatenating the
gathered shards in rank order restores the single-process order exactly: a W-worker
evaluation returns the same scores as a one-process one (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist


@dataclass
class EvalRunner:
    model: torch.nn.Module           # a DownstreamModel (has .predict)
    rank: int = 0
    world_size: int = 1
    batch_size: int = 128            # rows per forward pass
    device: torch.device = torch.device("cpu")
    # scores rank 0 received that were NaN or ±inf (they score nothing: vlp.benchmarks.accuracy)
    nonfinite: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> np.ndarray:
        """This rank's block of ``range(n)``."""
        return np.array_split(np.arange(n), self.world_size)[self.rank]

    @torch.no_grad()
    def predict(self, make_batch: Callable[[np.ndarray], dict[str, torch.Tensor]],
                items: np.ndarray, batch_size: int | None = None,
                post: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """Stacked ``model.predict`` outputs (float32 numpy) for ``items``, ``batch_size``
        items per batch, in eval mode (restored afterwards). ``post`` maps each batch's
        output first (e.g. argmax over regions, whose count differs between batches)."""
        size = batch_size or self.batch_size
        was_training = self.model.training
        self.model.eval()
        dtype = next(self.model.parameters()).dtype
        outs = []
        try:
            for start in range(0, len(items), size):
                batch = make_batch(items[start:start + size])
                batch = {k: (v.to(self.device, dtype) if v.is_floating_point()
                             else v.to(self.device)) for k, v in batch.items()}
                out = self.model.predict(batch).float().cpu().numpy()
                outs.append(post(out) if post is not None else out)
        finally:
            self.model.train(was_training)
        if not outs:
            return np.zeros((0,), np.float32)
        return np.concatenate(outs, 0)

    def gather(self, local: Any) -> list[Any] | None:
        """Every rank's ``local`` in rank order on rank 0 (None on the others)."""
        if self.world_size == 1:
            return [local]
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(f"evaluation over {self.world_size} workers needs the process "
                               "group Ray Train sets up")
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, local)
        return out if self.is_main else None

    def count_nonfinite(self, scores: np.ndarray) -> np.ndarray:
        """``scores`` (rank 0's gathered predictions), their NaN/±inf added to ``nonfinite``."""
        self.nonfinite += int(np.size(scores) - np.isfinite(scores).sum())
        return scores

    def predict_sharded(self, make_batch: Callable[[np.ndarray], dict[str, torch.Tensor]],
                        n: int, batch_size: int | None = None,
                        post: Callable[[np.ndarray], np.ndarray] | None = None
                        ) -> np.ndarray | None:
        """Predictions for items 0..n-1, computed shard by shard, whole on rank 0."""
        parts = self.gather(self.predict(make_batch, self.shard(n), batch_size, post))
        if parts is None:
            return None
        parts = [p for p in parts if len(p)]
        return self.count_nonfinite(np.concatenate(parts, 0) if parts
                                    else np.zeros((0,), np.float32))
