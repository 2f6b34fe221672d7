"""``predict``: ITM score and pooled embedding for a batch of the standard contract."""

from __future__ import annotations

from typing import Mapping

import torch

from vlp.models.model import VLPModel


@torch.no_grad()
def predict(model: VLPModel, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Returns ``itm_score`` [B] (P(match)), ``itm_logits`` [B, 2] and ``pooled`` [B, H]
    (pooler(dense + tanh)([CLS])). Runs in eval mode (no dropout, no dictionary update) and
    restores the model's mode afterwards."""
    if "itm" not in model.heads:
        raise KeyError(f"predict needs the itm head; this model has {list(model.heads)} "
                       "(build it with 'itm' among its tasks)")
    was_training = model.training
    model.eval()
    try:
        enc = model.encode(batch, pool=True)
        logits = model.heads["itm"](enc.pooled_output).float()
    finally:
        model.train(was_training)
    return {"itm_score": logits.softmax(-1)[:, 1], "itm_logits": logits,
            "pooled": enc.pooled_output}
