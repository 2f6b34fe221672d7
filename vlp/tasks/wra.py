"""WRA: word-region alignment by optimal transport, added to ITM (UNITER reference code).

It trains on ITM batches (no masking, swapped negatives, regions to align words with): the
ITM loss (shared ``itm`` head) plus 0.1 × the OT loss, where a pair's OT distance is
Σ T_ij C_ij between its text outputs and region outputs, with cosine cost C and the transport
plan T found by IPOT (proximal point with one Sinkhorn step per iteration; β 0.5, 50
iterations; no gradient through T). The OT loss pulls matched pairs together and pushes
mismatched ones apart: (Σ_pos dist − Σ_neg dist) / B. Reports ``itm_loss`` and the weighted
``wra_loss``; the total is their sum.

The text side of the plan is every real text token, ``[CLS]`` and ``[SEP]`` included, as in
the reference (its OT inputs scatter the whole text span, text lengths counting both): WRA is
not in the UNITER paper, so the reference code is its only definition, and leaving them out
would change every pair's marginals (1/len) and hence the distances a reproduction compares.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vlp.contract import batch_spec as bs
from vlp.contract.batch_access import require
from vlp.contract.encoder_output import EncoderOutput
from vlp.tasks.itm import itm_terms
from vlp.tasks.losses import row_valid, weighted_mean
from vlp.tasks.registry import register
from vlp.tasks.spec import Batch, HeadContext, Task

WRA_WEIGHT = 0.1
IPOT_BETA = 0.5
IPOT_ITERATIONS = 50


def cosine_cost(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[B, m, H], [B, n, H] → [B, m, n] cosine distance."""
    return 1.0 - F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).transpose(1, 2)


@torch.no_grad()
def ipot_plan(cost: torch.Tensor, x_valid: torch.Tensor, y_valid: torch.Tensor,
              beta: float = IPOT_BETA, iterations: int = IPOT_ITERATIONS) -> torch.Tensor:
    """Transport plan [B, m, n] between uniform marginals over the valid x and y items."""
    joint = (x_valid.unsqueeze(2) & y_valid.unsqueeze(1)).to(cost.dtype)
    x_len = x_valid.sum(1, keepdim=True).clamp(min=1).to(cost.dtype)
    y_len = y_valid.sum(1, keepdim=True).clamp(min=1).to(cost.dtype)
    kernel = torch.exp(-cost / beta) * joint
    plan = joint.clone()
    sigma = x_valid.to(cost.dtype) / x_len
    delta = y_valid.to(cost.dtype) / y_len
    for _ in range(iterations):
        q = kernel * plan
        delta = torch.where(y_valid, 1.0 / (y_len * (q.transpose(1, 2) @ sigma.unsqueeze(-1)
                                                     ).squeeze(-1)).clamp(min=1e-30), 0.0)
        sigma = torch.where(x_valid, 1.0 / (x_len * (q @ delta.unsqueeze(-1)).squeeze(-1)
                                            ).clamp(min=1e-30), 0.0)
        plan = sigma.unsqueeze(2) * q * delta.unsqueeze(1)
    return plan * joint


@register
class WordRegionAlignment(Task):
    name, label, order = "wra", "WRA", 8
    head_name = "itm"  # WRA is added to ITM: it trains the same head
    modality = None
    visual = frozenset({"regions"})
    families = frozenset({"uniter"})
    itm_negatives = True
    needs_pooled = True

    def build_head(self, ctx: HeadContext) -> nn.Module:
        return nn.Linear(ctx.hidden_size, 2)

    def compute(self, head: nn.Module, enc: EncoderOutput, batch: Batch) -> dict[str, torch.Tensor]:
        out = itm_terms(head, enc, batch)
        labels = require(batch, bs.ITM_LABELS, self.name).bool()
        words, regions = enc.text_mask, enc.region_mask   # [CLS] and [SEP] included
        cost = cosine_cost(enc.text_output().float(), enc.region_output().float())
        cost = cost.masked_fill(~(words.unsqueeze(2) & regions.unsqueeze(1)), 0.0)
        plan = ipot_plan(cost.detach(), words, regions)
        distance = (cost * plan).sum((1, 2))                      # [B]
        # matched pairs pulled together, mismatched pushed apart (a where, not a boolean
        # index: no device read)
        valid = row_valid(batch)   # padding rows of a fixed shape count for nothing
        ot = weighted_mean(torch.where(labels, distance, -distance), valid)
        out["wra_loss"] = WRA_WEIGHT * ot
        out["wra_ot_distance"] = weighted_mean(distance.detach(), valid)
        return out
