"""BERT self-attention with its query, key and value projections as one matrix product.

``transformers``' ``BertSelfAttention`` projects the hidden states three times, each a
``Linear`` followed by a view and a transpose: a dozen operations for the host to dispatch
in the forward and about as many again in the backward, per layer. ``FusedQKVSelfAttention``
keeps the three ``Linear`` modules (their parameters, names and initialisation, so
checkpoints, converted weights and the optimizer's groups are unchanged) and runs them as one
``linear`` over their weights stacked, then one view, one permute and one unbind. The
attention itself is still ``transformers``' (the implementation the config names), called as
``BertSelfAttention`` calls it, so dropout draws are the same.

On flat rows (``takes_flat_rows``: [B·L, hidden] hidden states and their (B, L) in the
``row_shape`` keyword) the layer's other products take their input without a view.

Only for the encoder's use here: no key/value cache, no cross-attention, not a decoder, no
ZeRO-3 partitioned weights; a call with any of those runs ``BertSelfAttention``'s own
forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import BertSelfAttention, eager_attention_forward

# what BertSelfAttention's forward would use a cache or encoder states for
_NOT_FUSED = ("cache", "past_key_values", "encoder_hidden_states")
ROW_SHAPE = "row_shape"   # the keyword that carries (B, L) of flat rows


class FusedQKVSelfAttention(BertSelfAttention):
    """``BertSelfAttention`` whose three input projections are one ``linear``."""

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        # flat rows: [B·L, hidden] hidden states, (B, L) given by the backbone
        rows = kwargs.pop(ROW_SHAPE, None)
        # (a ZeRO-3 parameter, ``ds_id``, is gathered only when its own module runs)
        if args or self.is_decoder or hidden_states.dim() != (3 if rows is None else 2) or any(
                kwargs.get(k) is not None for k in _NOT_FUSED) or hasattr(
                self.query.weight, "ds_id"):
            if rows is None:
                return super().forward(hidden_states, attention_mask, *args, **kwargs)
            out, weights = super().forward(hidden_states.view(*rows, -1), attention_mask,
                                           *args, **kwargs)
            return out.reshape(hidden_states.shape[0], -1), weights
        for k in _NOT_FUSED:
            kwargs.pop(k, None)
        batch, length = rows if rows is not None else hidden_states.shape[:2]
        weight = torch.cat((self.query.weight, self.key.weight, self.value.weight))
        bias = torch.cat((self.query.bias, self.key.bias, self.value.bias))
        qkv = F.linear(hidden_states, weight, bias).view(
            batch, length, 3, self.num_attention_heads, self.attention_head_size)
        # [3, B, heads, L, head size]: each of q, k, v laid out as the transposed views
        # BertSelfAttention hands the attention (the head size contiguous)
        query, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                       eager_attention_forward)
        out, weights = attend(self, query, key, value, attention_mask,
                              dropout=self.dropout.p if self.training else 0.0,
                              scaling=self.scaling, **kwargs)
        return out.reshape(*hidden_states.shape[:-1], -1).contiguous(), weights


def takes_flat_rows(encoder: nn.Module) -> bool:
    """Whether every layer of ``encoder`` (a ``BertEncoder``) has the fused self-attention,
    so that the encoder can run on flat rows: hidden states [B·L, hidden], with
    ``row_shape=(B, L)`` among its keyword arguments (``transformers`` hands them down to
    each layer's attention). Every other operation of a layer works on the last dimension;
    its ``Linear`` modules then multiply [B·L, hidden] as it is, where a [B, L, hidden] input
    costs a view before and after each product, in the forward and again in the backward."""
    return all(type(layer.attention.self) is FusedQKVSelfAttention for layer in encoder.layer)


def fuse_qkv(encoder: nn.Module) -> int:
    """Switch every plain ``BertSelfAttention`` under ``encoder`` to the fused forward, in
    place (same parameters); the number switched (none where this ``transformers`` has no
    attention-function registry to call)."""
    if not hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):
        return 0
    return _switch(encoder, BertSelfAttention, FusedQKVSelfAttention)


def separate_qkv(encoder: nn.Module) -> int:
    """Undo ``fuse_qkv`` (``transformers``' own forward again); the number switched back."""
    return _switch(encoder, FusedQKVSelfAttention, BertSelfAttention)


def _switch(encoder: nn.Module, old: type, new: type) -> int:
    modules = [m for m in encoder.modules() if type(m) is old]
    for module in modules:
        module.__class__ = new
    return len(modules)
