"""Self-attention over the real tokens only (``transformer.attention: varlen``), registered
with ``transformers`` as ``"vlp_varlen"``.

A packed row (``packing.py``) is its real tokens, then padding. Here each row is two
segments of the flat [B·W] token buffer — its real tokens, then its padding — and every
token attends within its own segment only: real tokens see exactly the keys the padded
kernel's mask lets them see, so their outputs and every gradient are the padded kernel's;
padding tokens attend among themselves (finite values nothing reads), where the padded
kernel computed them against the real keys. The [B·W] buffer keeps its shape (the fixed
shapes of CUDA graphs and static compile need it); what is skipped is the attention work
between a row's real tokens and its padding, and the mask.

On CUDA the segments are the offsets of a nested jagged tensor, and SDPA on nested tensors
runs the fused variable-length kernels with ``cu_seqlens`` (flash for bf16/fp16, the
memory-efficient one for fp32), attention dropout included (``torch.nn.attention.varlen``
has none in torch 2.11–2.13, flex attention neither). The fused kernels refuse an empty
segment, so the backbone packs every row one slot wider than its longest (``SPARE_SLOTS``):
every padding segment holds at least one token, and ``min_seqlen`` = 1, ``max_seqlen`` = W
are host integers (no read of the offsets: no host sync). Off CUDA, SDPA on nested tensors
would split the buffer at host-read lengths; there the same segments are a dense
[B, 1, W, W] mask over the padded layout, through the attention the padded path runs on a
CPU (``attention.py`` in training with dropout, SDPA otherwise) — the same result for every
real token, tested against the nested path on a CPU (tests/test_varlen_attention.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from vlp.models import attention as eager

NAME = "vlp_varlen"
SPARE_SLOTS = 1   # a padding segment of every row, never empty (the fused kernels refuse one)


@dataclass(frozen=True)
class Segments:
    """What the encoder's attention gets in place of a padding mask."""

    offsets: torch.Tensor        # [2B + 1]: row b's real tokens, then its padding, in [B·W]
    rows: int                    # B
    width: int                   # W: the packed row length, a host integer
    dense: torch.Tensor | None   # off CUDA: [B, 1, W, W], True where query and key share one


def segments(attention_mask: torch.Tensor, dense_dtype: torch.dtype | None = None
             ) -> Segments:
    """The segments of packed rows from their [B, W] mask (1 = real token, real tokens
    first), on the mask's device, without reading it on the host. ``dense_dtype``: the dense
    mask for the padded layout as well — boolean for SDPA, or additive in this dtype for
    eager attention (``attention.py``)."""
    b, w = attention_mask.shape
    # int32: the kernels' cu_seqlens as they are (no conversion in every layer). A row with
    # no real token (a fixed-shape batch's padding row, data.fixed_shapes) gets a first
    # segment of one token all the same: no segment is empty, and nothing reads that row
    lengths = attention_mask.sum(1, dtype=torch.int32).clamp_(min=1)
    starts = torch.arange(b, dtype=torch.int32, device=attention_mask.device) * w
    offsets = torch.cat((torch.stack((starts, starts + lengths), 1).flatten(),
                         starts.new_full((1,), b * w)))
    dense = None
    if dense_dtype is not None:
        first = torch.arange(w, device=attention_mask.device)[None] < lengths[:, None]
        same = first[:, None, :, None] == first[:, None, None, :]
        dense = same if dense_dtype == torch.bool else torch.zeros(
            same.shape, dtype=dense_dtype, device=same.device).masked_fill(
            ~same, torch.finfo(dense_dtype).min)
    return Segments(offsets, b, w, dense)


def _jagged(x: torch.Tensor, seg: Segments, contiguous: bool) -> torch.Tensor:
    """[B, heads, W, d] (any strides with d contiguous, as fused_qkv's views of one
    projection) → a nested jagged [2B, heads, j, d] over the same buffer."""
    b, heads, w, d = x.shape
    flat = x.transpose(1, 2).reshape(b * w, heads, d)   # a view for fused_qkv's layout
    if contiguous:
        flat = flat.contiguous()
    return torch.nested.nested_tensor_from_jagged(
        flat, seg.offsets, min_seqlen=1, max_seqlen=w).transpose(1, 2)


def nested_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     seg: Segments, scaling: float, dropout: float) -> torch.Tensor:
    """SDPA on nested jagged tensors: [B, heads, W, d] each → [B, W, heads, d]. On CUDA the
    fused kernels read the buffers in place; elsewhere SDPA's math path needs them
    contiguous (and reads the segment lengths on the host: tests only)."""
    b, heads, w, d = query.shape
    contiguous = query.device.type != "cuda"
    out = F.scaled_dot_product_attention(
        _jagged(query, seg, contiguous), _jagged(key, seg, contiguous),
        _jagged(value, seg, contiguous), dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).values().view(b, w, heads, -1)


def dense_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, seg: Segments, scaling: float,
                    dropout: float) -> torch.Tensor:
    """The same segments as a dense mask over the padded layout → [B, W, heads, d]."""
    if seg.dense is None:
        raise ValueError("transformer.attention=varlen off CUDA needs the segments' dense "
                         "mask (vlp_varlen.segments(..., dense_dtype=...))")
    if seg.dense.dtype != torch.bool:   # eager's operations (attention.py), dropout included
        out, _ = eager.vlp_eager_attention(module, query, key, value, seg.dense,
                                           scaling=scaling, dropout=dropout)
        return out
    return F.scaled_dot_product_attention(query, key, value, attn_mask=seg.dense,
                                          dropout_p=dropout, scale=scaling).transpose(1, 2)


def vlp_varlen_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor, attention_mask: Any,
                         scaling: float | None = None, dropout: float = 0.0,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The ``AttentionInterface`` signature, ``attention_mask`` a ``Segments``: q, k, v
    [B, heads, W, d] → ([B, W, heads, d], no probabilities)."""
    if not isinstance(attention_mask, Segments):
        raise TypeError(f"{NAME}: expected the backbone's Segments as the attention mask, got "
                        f"{type(attention_mask).__name__} (transformer.attention=varlen runs "
                        f"only inside VLBackbone)")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if query.device.type == "cuda":
        out = nested_attention(query, key, value, attention_mask, scaling, dropout)
    else:
        out = dense_attention(module, query, key, value, attention_mask, scaling, dropout)
    return out, None


AttentionInterface.register(NAME, vlp_varlen_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)   # never asked: the backbone builds Segments
