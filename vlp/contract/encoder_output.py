"""``EncoderOutput``: what every head, pretraining or downstream, reads from the backbone.

It sits in the contract (not beside the backbone) so that tasks and heads depend on this
shape only, never on the model that produces it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

MVM_LABELS = "mvm_labels"  # extras key: long [B, n] dictionary index at masked cells, else -100


@dataclass
class EncoderOutput:
    """What heads (pretraining and downstream) read from the backbone.

    ``sequence_output`` is the packed row; ``text_output()`` / ``region_output()`` give it back
    in the batch's own text / region layout ([B, T, H] / [B, N, H]), and ``text_positions`` /
    ``region_positions`` say where each token sits in the packed row."""

    sequence_output: torch.Tensor    # [B, L, H]
    attention_mask: torch.Tensor     # long [B, L]
    text_positions: torch.Tensor     # long [B, T]
    text_mask: torch.Tensor          # bool [B, T]
    region_positions: torch.Tensor   # long [B, N] (regions, or SOHO grid cells)
    region_mask: torch.Tensor        # bool [B, N]
    pooled_output: torch.Tensor | None = None  # [B, H] pooler(dense+tanh)([CLS]) when asked
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def cls_output(self) -> torch.Tensor:
        return self.sequence_output[:, 0]

    def _gather(self, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.sequence_output.shape[-1]
        index = positions.unsqueeze(-1).expand(*positions.shape, hidden)
        return self.sequence_output.gather(1, index)

    def text_output(self) -> torch.Tensor:
        return self._gather(self.text_positions)

    def region_output(self) -> torch.Tensor:
        return self._gather(self.region_positions)

    def select_text(self, select: torch.Tensor) -> torch.Tensor:
        """[M, H] outputs of the text tokens where ``select`` (bool [B, T]) holds."""
        rows, cols = select.nonzero(as_tuple=True)
        return self.sequence_output[rows, self.text_positions[rows, cols]]

    def select_regions(self, select: torch.Tensor) -> torch.Tensor:
        """[M, H] outputs of the regions where ``select`` (bool [B, N]) holds."""
        rows, cols = select.nonzero(as_tuple=True)
        return self.sequence_output[rows, self.region_positions[rows, cols]]

    def text_at(self, targets: torch.Tensor) -> torch.Tensor:
        """[M, H] outputs of the text tokens at ``targets`` (long [2, M]: rows, columns)."""
        rows, cols = targets[0], targets[1]
        return self.sequence_output[rows, self.text_positions[rows, cols]]

    def regions_at(self, targets: torch.Tensor) -> torch.Tensor:
        """[M, H] outputs of the regions at ``targets`` (long [2, M]: rows, columns)."""
        rows, cols = targets[0], targets[1]
        return self.sequence_output[rows, self.region_positions[rows, cols]]
