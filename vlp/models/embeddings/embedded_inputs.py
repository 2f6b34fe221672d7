"""What a family's embedder hands to the packer: text and visual tokens, separately padded."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# extras under this prefix are per-batch measurements (SOHO's dictionary usage) that the model
# reports beside its losses, under the name after the prefix
METRIC_PREFIX = "metric/"


@dataclass
class EmbeddedInputs:
    text: torch.Tensor          # [B, T, H] embedded text ([CLS] … [SEP], padding at the end)
    text_mask: torch.Tensor     # bool [B, T]
    visual: torch.Tensor        # [B, V, H] visual tokens: the N regions / grid cells first,
                                #   then family extras (VL-BERT's [END])
    visual_mask: torch.Tensor   # bool [B, V]
    num_regions: int            # N: how many of the V visual tokens are regions / grid cells
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. SOHO's mvm_labels
