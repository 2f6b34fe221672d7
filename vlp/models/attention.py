"""Eager attention for CPU training, registered with ``transformers`` as ``"vlp_eager"``.

``transformers``' eager attention computes ``matmul(q, kᵀ) * scaling`` and, for a padded
batch, ``+ mask`` out of place: two extra passes over the [B, heads, L, L] scores in the
forward and the scaling's pass again in the backward. Here the scaling is the GEMM's
``alpha`` (``baddbmm`` with ``beta=0``), forward and backward, and the mask is added in
place to the GEMM's output. Every other operation is eager's, in its order, on operands of
the same layout: the dropout draws and, for a power-of-two scaling (head sizes 16 and 64:
1/4, 1/8), the results are bit for bit eager's; for other head sizes the scaling is applied
to the dot products instead of to the incoming gradient, a rounding apart.

Used where the backbone picks eager attention (``VLBackbone._attention_for``); its padding
mask is ``transformers``' eager mask (float, 0 or the dtype's minimum).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

NAME = "vlp_eager"


class _ScaledScores(torch.autograd.Function):
    """``alpha · q kᵀ (+ mask)`` as [B, heads, Lq, Lk] for q [B·heads, Lq, d] and kᵀ
    [B·heads, d, Lk] (both contiguous, as ``matmul`` makes them): alpha inside the GEMM in
    both directions, the mask (no gradient) added in place."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k_t: torch.Tensor, alpha: float, heads: int,
                mask: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(q, k_t)
        ctx.alpha = alpha
        n, lq, lk = q.shape[0], q.shape[1], k_t.shape[2]
        out = q.new_empty(n // heads, heads, lq, lk)
        flat = out.view(n, lq, lk)
        torch.baddbmm(flat, q, k_t, beta=0, alpha=alpha, out=flat)
        if mask is not None:
            out.add_(mask)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k_t = ctx.saved_tensors
        grad = grad.reshape(q.shape[0], q.shape[1], k_t.shape[2])
        grad_q = grad_k_t = None
        # the operands of bmm's own backward (grad·kᵀᵀ and qᵀ·grad), alpha in the GEMM
        if ctx.needs_input_grad[0]:
            grad_q = q.new_empty(q.shape)
            torch.baddbmm(grad_q, grad, k_t.transpose(1, 2), beta=0, alpha=ctx.alpha,
                          out=grad_q)
        if ctx.needs_input_grad[1]:
            grad_k_t = k_t.new_empty(k_t.shape)
            torch.baddbmm(grad_k_t, q.transpose(1, 2), grad, beta=0, alpha=ctx.alpha,
                          out=grad_k_t)
        return grad_q, grad_k_t, None, None, None


def vlp_eager_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, attention_mask: torch.Tensor | None,
                        scaling: float | None = None, dropout: float = 0.0,
                        **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``AttentionInterface`` signature: q, k, v [B, heads, L, d] → ([B, L, heads, d],
    the attention probabilities)."""
    b, heads, lq, d = query.shape
    lk = key.shape[2]
    if scaling is None:
        scaling = d ** -0.5
    # the copies matmul makes of the head-strided projections (q and kᵀ contiguous)
    q = query.reshape(b * heads, lq, d)
    k_t = key.transpose(2, 3).reshape(b * heads, d, lk)
    weights = _ScaledScores.apply(q, k_t, scaling, heads, attention_mask)
    weights = nn.functional.softmax(weights, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


AttentionInterface.register(NAME, vlp_eager_attention)
AttentionMaskInterface.register(NAME, eager_mask)
