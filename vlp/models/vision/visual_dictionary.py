"""SOHO's visual dictionary (VD): online clustering of grid features with a moving average.

Each feature v takes its nearest entry d_h (L2); the output is v + stopgrad(d_h − v), so the
forward value is the entry and the gradient reaches the CNN unchanged (straight-through).
In training, every entry that received features moves towards their mean:
d_j ← γ d_j + (1 − γ) · mean{v_i : h_i = j}; entries nobody chose stay put. The sums and
counts are all-reduced across ranks first, so every rank applies the same update and the
dictionaries stay identical without broadcasting them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class VisualDictionary(nn.Module):
    def __init__(self, size: int, dim: int, momentum: float = 0.4):
        super().__init__()
        self.size, self.dim, self.momentum = size, dim, momentum
        # A buffer, not a parameter: only the moving average moves it (never the optimiser)
        self.register_buffer("embedding", torch.empty(size, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Unit-variance entries, the scale of the LayerNorm-free conv features they cluster
        nn.init.normal_(self.embedding)

    @torch.no_grad()
    def assign(self, features: torch.Tensor) -> torch.Tensor:
        """[..., dim] → long [...]: index of the nearest entry by L2 (fp32 distances)."""
        flat = features.reshape(-1, self.dim).float()
        d = self.embedding.float()
        dist2 = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ d.t() + d.pow(2).sum(1)[None]
        return dist2.argmin(1).reshape(features.shape[:-1])

    def forward(self, features: torch.Tensor, valid: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``features`` [..., dim], ``valid`` bool [...] (padding cells neither update nor vote)
        → (straight-through quantised features [..., dim], indices long [...])."""
        indices = self.assign(features)
        quantised = self.embedding[indices].to(features.dtype)
        out = features + (quantised - features).detach()
        if self.training:
            keep = valid if valid is not None else torch.ones_like(indices, dtype=torch.bool)
            self.update(features.detach()[keep], indices[keep])
        return out, indices

    @torch.no_grad()
    def update(self, features: torch.Tensor, indices: torch.Tensor) -> None:
        """Moving-average update of the used entries from ``features`` [M, dim] assigned to
        ``indices`` [M] (statistics summed over all ranks when torch.distributed is up)."""
        sums = torch.zeros(self.size, self.dim, device=features.device, dtype=torch.float32)
        sums.index_add_(0, indices, features.float())
        counts = torch.bincount(indices, minlength=self.size).to(torch.float32)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
            dist.all_reduce(counts)
        used = counts > 0
        mean = sums[used] / counts[used].unsqueeze(1)
        old = self.embedding[used].float()
        self.embedding[used] = (self.momentum * old + (1 - self.momentum) * mean).to(
            self.embedding.dtype)
