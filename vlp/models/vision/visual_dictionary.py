"""SOHO's visual dictionary (VD): online clustering of grid features with a moving average.

Each feature v takes its nearest entry d_h (L2); the output is v + stopgrad(d_h − v), so the
forward value is the entry and the gradient reaches the CNN unchanged (straight-through).
In training, every entry that received features moves towards their mean:
d_j ← γ d_j + (1 − γ) · mean{v_i : h_i = j}; entries nobody chose stay put. The sums and
counts are all-reduced across ranks first, so every rank applies the same update and the
dictionaries stay identical without broadcasting them.

Initialisation (``init="data"``, vlp's default, not the paper's): the first training
batch's features, sampled at random (rank 0's, broadcast), become the entries, so that
entries start at the features' scale and inside their cloud. SOHO's paper initialises the
dictionary randomly (§3.2, "The visual dictionary D is randomly initialized"): that is
``init="normal"`` (N(0, 1)), whose entries sit far from features of another scale: a handful
of entries win every cell and the rest are never used (jobs/benchmarks/soho_dictionary.py
measures the share of entries in use).
The ``initialised`` flag is a buffer, so a resumed run keeps its entries.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

INITS = ("data", "normal")


class VisualDictionary(nn.Module):
    def __init__(self, size: int, dim: int, momentum: float = 0.4, init: str = "data"):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"visual dictionary init {init!r}: expected one of {INITS}")
        self.size, self.dim, self.momentum, self.init = size, dim, momentum, init
        self.updates = True   # off: training forwards leave the entries (running_stats.py)
        # off for a finetune (SOHO §4.2 finetunes on the features; unless asked, the
        # dictionary stays as pre-training left it); apart from ``updates``, which
        # running_stats switches back on after each summed step
        self.frozen = False
        # A buffer, not a parameter: only the moving average moves it (never the optimiser)
        self.register_buffer("embedding", torch.empty(size, dim))
        self.register_buffer("initialised", torch.tensor(False))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Placeholder entries until the first training batch (init="data") replaces them
        nn.init.normal_(self.embedding)
        self.initialised.fill_(self.init == "normal")
        self._known: bool | None = None   # the flag read once, not on every step (a sync)

    def _is_initialised(self) -> bool:
        if self._known is None:
            self._known = bool(self.initialised)
        return self._known

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # checkpoints written before the flag existed hold trained entries: keep them
        state_dict.setdefault(prefix + "initialised", torch.tensor(True))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._known = None

    @torch.no_grad()
    def initialise_from(self, features: torch.Tensor) -> None:
        """Entries ← ``size`` features [M, dim] drawn at random (without replacement when
        M ≥ size; else repeats, nudged apart by noise at 1e-3 of the features' spread)."""
        flat = features.reshape(-1, self.dim).float()
        if flat.shape[0] == 0:   # nothing to sample (still joins the broadcast below)
            entries = self.embedding.float().clone()
        elif flat.shape[0] >= self.size:
            pick = torch.randperm(flat.shape[0], device=flat.device)[:self.size]
            entries = flat[pick]
        else:
            pick = torch.randint(flat.shape[0], (self.size,), device=flat.device)
            spread = flat.std(unbiased=False)
            entries = flat[pick] + 1e-3 * spread * torch.randn_like(flat[pick])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast(entries, src=0)   # one dictionary on every rank
        self.embedding.copy_(entries.to(self.embedding.dtype))
        self.initialised.fill_(True)
        self._known = True

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
        if self.training and not self.frozen and not self._is_initialised():
            keep = valid if valid is not None else torch.ones(
                features.shape[:-1], dtype=torch.bool, device=features.device)
            self.initialise_from(features.detach()[keep])
        indices = self.assign(features)
        quantised = self.embedding[indices].to(features.dtype)
        out = features + (quantised - features).detach()
        if self.training and self.updates and not self.frozen:
            self.update(features.detach(), indices, valid)
        return out, indices

    @torch.no_grad()
    def update(self, features: torch.Tensor, indices: torch.Tensor,
               valid: torch.Tensor | None = None) -> None:
        """Moving-average update of the used entries from ``features`` [..., dim] assigned to
        ``indices`` [...], the cells where ``valid`` holds (statistics summed over all ranks
        when torch.distributed is up). Padding cells enter with weight 0 rather than being
        left out by a boolean index, and the unused entries are kept by a ``where``: nothing
        here reads a device value (no host sync)."""
        flat = features.reshape(-1, self.dim).float()
        index = indices.reshape(-1)
        weight = (torch.ones_like(index, dtype=torch.float32) if valid is None
                  else valid.reshape(-1).to(torch.float32))
        sums = torch.zeros(self.size, self.dim, device=flat.device, dtype=torch.float32)
        sums.index_add_(0, index, flat * weight[:, None])
        counts = torch.zeros(self.size, device=flat.device, dtype=torch.float32)
        counts.index_add_(0, index, weight)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
            dist.all_reduce(counts)
        used = (counts > 0)[:, None]
        mean = sums / counts.clamp(min=1)[:, None]
        old = self.embedding.float()
        moved = self.momentum * old + (1 - self.momentum) * mean
        self.embedding.copy_(torch.where(used, moved, old).to(self.embedding.dtype))
