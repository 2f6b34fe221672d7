"""Model FLOPs of a training step: the one formula the benchmarks and the training loop share.

Encoder training FLOPs = 3 × forward (backward ≈ 2 × forward), forward = 2 · (encoder matmul
weights) · tokens + 4 · tokens · S · H per layer (QKᵀ and AV over sequences of length S).
Embeddings and heads are left out (small next to the encoder). With budget batching the
sequence length varies inside a batch; ``S`` is the batch's mean (input units / examples),
which slightly undercounts attention on uneven batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EncoderShape:
    linear_weights: int      # weights of the encoder's Linear layers (no biases)
    hidden: int
    layers: int

    def train_flops(self, examples: float, input_units: float) -> float:
        """FLOPs of forward + backward over ``examples`` rows holding ``input_units``
        tokens / regions in all."""
        if examples <= 0 or input_units <= 0:
            return 0.0
        seq = input_units / examples
        forward = (2 * self.linear_weights * input_units
                   + 4 * input_units * seq * self.hidden * self.layers)
        return 3.0 * forward


def encoder_shape(model: torch.nn.Module) -> EncoderShape | None:
    """The encoder shape of a ``VLPModel`` (or anything with ``backbone.encoder.layer``);
    None for a model without one (the toy model of the tests)."""
    backbone = getattr(model, "backbone", None)
    encoder = getattr(backbone, "encoder", None)
    if encoder is None or not hasattr(encoder, "layer"):
        return None
    weights = sum(m.weight.numel() for m in encoder.modules() if isinstance(m, torch.nn.Linear))
    return EncoderShape(weights, backbone.hidden_size, len(encoder.layer))
