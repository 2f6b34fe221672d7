"""The shared backbone: family embeddings → packed row → BERT encoder (post-LN) → outputs.

The encoder is ``transformers``' ``BertEncoder`` built from a ``BertConfig`` (no hub access),
its self-attention's three input projections run as one (``fused_qkv.py``, the same weights);
attention goes through ``config._attn_implementation`` — "sdpa" by default, i.e.
``torch.nn.functional.scaled_dot_product_attention`` with the boolean padding mask that
``create_bidirectional_mask`` builds for that implementation (none when no row is padded),
except in CPU training with attention dropout, where eager attention is cheaper (see
``_attention_for``; ``attention.py``: eager's operations with fewer passes over the scores).
The pooler (dense + tanh on position 0) belongs to the backbone's weights but only heads that
need it call it.
"""

from __future__ import annotations

from functools import partial
from typing import Mapping

import torch
import torch.utils.checkpoint
from torch import nn
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.bert.modeling_bert import BertEncoder, BertPooler

from vlp.contract.batch_access import host_rows
from vlp.contract.encoder_output import EncoderOutput
from vlp.models import attention, varlen_attention
from vlp.models.family_config import FamilyConfig
from vlp.models.embeddings import EMBEDDERS
from vlp.models.embeddings.embedded_inputs import EmbeddedInputs
from vlp.models.embeddings.text import TextEmbeddings
from vlp.models.fused_qkv import ROW_SHAPE, fuse_qkv, takes_flat_rows
from vlp.models.packing import pack


class VLBackbone(nn.Module):
    def __init__(self, family: FamilyConfig, feat_dim: int):
        super().__init__()
        cfg = family.transformer
        self.family = family
        self.bert_config = cfg.to_bert_config()
        self.text_embeddings = TextEmbeddings(cfg)
        self.visual = EMBEDDERS[family.visual.kind](cfg, family.visual, feat_dim)
        self.encoder = BertEncoder(self.bert_config)
        if cfg.fused_qkv:
            fuse_qkv(self.encoder)
        self.pooler = BertPooler(self.bert_config)
        self.attention_layout = "padded"
        self._padded_implementation = self.bert_config._attn_implementation
        self.set_attention_layout(cfg.attention)
        self.token_type_layout = ""   # the downstream layout its type table was extended for
        self.activation_checkpointing = False

    @property
    def hidden_size(self) -> int:
        return self.bert_config.hidden_size

    def set_activation_checkpointing(self, on: bool = True) -> None:
        """Recompute each encoder layer in the backward instead of keeping its activations
        (``train.activation_checkpointing``). The RNG state is replayed, so dropout masks —
        and the loss and gradients — are the same as without."""
        self.activation_checkpointing = on
        for layer in self.encoder.layer:   # transformers' GradientCheckpointingLayer
            layer.gradient_checkpointing = on
            layer._gradient_checkpointing_func = partial(torch.utils.checkpoint.checkpoint,
                                                         use_reentrant=False)

    def set_attention_layout(self, layout: str) -> None:
        """``transformer.attention``: "padded" (the configured implementation with a padding
        mask) or "varlen" (each row's real tokens only: varlen_attention.py). The layers
        read the implementation from the shared config; varlen's stays there for the
        backward's recompute under activation checkpointing."""
        if layout == self.attention_layout:
            return
        if layout == "varlen":
            if self.bert_config._attn_implementation != "sdpa":
                raise ValueError(f"transformer.attention='varlen' cannot be combined with "
                                 f"attn_implementation="
                                 f"{self.bert_config._attn_implementation!r}: leave it 'sdpa'")
            self.bert_config._attn_implementation = varlen_attention.NAME
        elif layout == "padded":
            self.bert_config._attn_implementation = self._padded_implementation
        else:
            raise ValueError(f"transformer.attention={layout!r}: expected 'padded' or 'varlen'")
        self.attention_layout = layout

    def _attention_for(self, x: torch.Tensor, configured: str) -> str:
        """"sdpa" runs fused kernels on CUDA (dropout included) and on CPU without dropout;
        on CPU with attention dropout in training it falls back to its math path, which
        costs more than plain (eager) attention — the q and k scaled apart, a NaN-safe
        softmax, the boolean mask turned additive in every layer — so a CPU training step
        runs eager attention there (the same dropout draws). Not under activation
        checkpointing: the backward's recompute runs after ``forward`` has put the configured
        implementation back, and must draw its dropout masks the way the forward did."""
        if (configured == "sdpa" and not self.activation_checkpointing
                and x.device.type == "cpu" and self.training
                and self.bert_config.attention_probs_dropout_prob > 0):
            return attention.NAME    # eager's operations, fewer passes over the scores
        return configured

    def forward(self, batch: Mapping[str, torch.Tensor], pool: bool = False,
                visual_masking: bool = False) -> EncoderOutput:
        inputs = self.visual(batch, self.text_embeddings, visual_masking=visual_masking)
        layout = host_layout(batch, inputs)
        varlen = self.attention_layout == "varlen"
        rows = pack(inputs.text, inputs.text_mask, inputs.visual, inputs.visual_mask,
                    None if layout is None else layout[0],
                    spare=varlen_attention.SPARE_SLOTS if varlen else 0)
        if varlen:
            sequence = self._encode(rows.embeddings, self._segments(rows))
            return self._output(inputs, rows, sequence, pool)
        configured = self.bert_config._attn_implementation
        attention = self._attention_for(rows.embeddings, configured)
        try:   # the layers read the implementation from the shared config at call time
            self.bert_config._attn_implementation = attention
            if layout is None:   # transformers' mask: it asks the device whether any row is padded
                mask = create_bidirectional_mask(config=self.bert_config,
                                                 inputs_embeds=rows.embeddings,
                                                 attention_mask=rows.attention_mask)
            else:   # no mask for an unpadded batch: SDPA may pick its flash kernel
                mask = (padding_mask(rows.attention_mask, attention, rows.embeddings.dtype)
                        if layout[1] else None)
            sequence = self._encode(rows.embeddings, mask)
        finally:
            self.bert_config._attn_implementation = configured
        return self._output(inputs, rows, sequence, pool)

    def _segments(self, rows) -> varlen_attention.Segments:
        """Variable-length attention's segments; off CUDA with their dense mask for the
        padded layout: additive for eager attention where the padded path would run it (CPU
        training with attention dropout, ``_attention_for``), boolean for SDPA otherwise."""
        x = rows.embeddings
        dense = None
        if x.device.type != "cuda":
            eager = self._attention_for(x, "sdpa") == attention.NAME
            dense = x.dtype if eager else torch.bool
        return varlen_attention.segments(rows.attention_mask, dense)

    def _output(self, inputs: EmbeddedInputs, rows, sequence: torch.Tensor,
                pool: bool) -> EncoderOutput:
        n = inputs.num_regions
        return EncoderOutput(
            sequence_output=sequence,
            attention_mask=rows.attention_mask,
            text_positions=rows.text_positions,
            text_mask=inputs.text_mask,
            region_positions=rows.visual_positions[:, :n],
            region_mask=inputs.visual_mask[:, :n],
            pooled_output=self.pooler(sequence) if pool else None,
            extras=inputs.extras,
        )

    def _encode(self, embeddings: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if not takes_flat_rows(self.encoder):
            return self.encoder(embeddings, attention_mask=mask).last_hidden_state
        b, n, d = embeddings.shape   # flat rows: each Linear multiplies [B·L, hidden] as it is
        return self.encoder(embeddings.view(b * n, d), attention_mask=mask,
                            **{ROW_SHAPE: (b, n)}).last_hidden_state.view(b, n, d)


def host_layout(batch: Mapping[str, torch.Tensor], inputs: EmbeddedInputs
                ) -> tuple[int, bool] | None:
    """(packed width, whether any row is padded) as host values, where the batch carries
    them (the pretraining collate: ``ROW_LENGTH``, ``REAL_UNITS``, handed over as Python ints
    by the prefetcher); None for a batch built elsewhere (the device is asked). The width is
    the row's text + regions plus the family's extra visual tokens, counted by their mask's
    width (VL-BERT's [END]: none in a batch without regions, whose [END] mask has zero
    width); SOHO's rows are text + every grid cell (the collate's count of the padded image)."""
    rows = host_rows(batch, inputs.text.shape[0])
    if rows is None:
        return None
    row, padded = rows
    extras = inputs.visual_mask.shape[1] - inputs.num_regions
    width = min(row + extras, inputs.text.shape[1] + inputs.visual.shape[1])
    return width, padded


def padding_mask(attention_mask: torch.Tensor, implementation: str,
                 dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, 1, L] key padding mask for the encoder's attention: boolean (True = attend) for
    SDPA, additive (0 or the dtype's minimum) for eager attention — the masks ``transformers``
    builds, broadcast over queries, without its check whether any row is padded (a read of a
    device value: the host knows, ``host_layout``)."""
    keep = attention_mask.bool()[:, None, None, :]
    if implementation == "sdpa":
        return keep
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(
        ~keep, torch.finfo(dtype).min)
