"""Pack separately padded text and visual tokens into one row per example (UNITER layout).

Row b holds its ``text_len`` real text tokens, then its real visual tokens, then padding up
to the longest row of the batch; one attention mask covers it. No padding sits between the
modalities, so a short caption does not leave holes that every later token attends around,
and a batch costs max(text_len + visual_len) positions instead of max(text) + max(visual).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedRows:
    embeddings: torch.Tensor        # [B, L, H]
    attention_mask: torch.Tensor    # long [B, L], 1 = real token
    text_positions: torch.Tensor    # long [B, T]: packed index of each text token (0 if padding)
    visual_positions: torch.Tensor  # long [B, V]: packed index of each visual token (0 if padding)


def pack(text: torch.Tensor, text_mask: torch.Tensor, visual: torch.Tensor,
         visual_mask: torch.Tensor, width: int | None = None, spare: int = 0) -> PackedRows:
    """``width``: the longest row (text + visual tokens), a host integer the batch carries
    (``batch_spec.ROW_LENGTH``); without it the device is asked, and the host waits.
    ``spare``: padding slots added to every row beyond the longest (variable-length
    attention keeps a row's padding segment non-empty: varlen_attention.py)."""
    b, t, hidden = text.shape
    v = visual.shape[1]
    text_mask, visual_mask = text_mask.bool(), visual_mask.bool()
    text_len = text_mask.sum(1)
    lengths = text_len + visual_mask.sum(1)
    if width is None:
        width = int(lengths.max())   # a host sync: batches built outside the pretraining collate
    width += spare
    # packed slot of every source token; padding goes to a spill slot (index `width`)
    text_slot = torch.where(text_mask, text_mask.cumsum(1) - 1, width)
    visual_slot = torch.where(visual_mask, text_len[:, None] + visual_mask.cumsum(1) - 1, width)
    # invert: for every packed slot, which source row of cat([text, visual, zero]) fills it
    zero_row = t + v
    source = torch.full((b, width + 1), zero_row, dtype=torch.long, device=text.device)
    source.scatter_(1, text_slot, torch.arange(t, device=text.device).expand(b, t))
    source.scatter_(1, visual_slot, torch.arange(t, t + v, device=text.device).expand(b, v))
    source = source[:, :width]
    stacked = torch.cat([text, visual.to(text.dtype), text.new_zeros(b, 1, hidden)], dim=1)
    # a gather (not a scatter) so the backward is a deterministic index-add
    packed = stacked.gather(1, source.unsqueeze(-1).expand(b, width, hidden))
    attention_mask = (torch.arange(width, device=text.device)[None] < lengths[:, None]).long()
    return PackedRows(
        embeddings=packed,
        attention_mask=attention_mask,
        text_positions=torch.where(text_mask, text_slot, 0),
        visual_positions=torch.where(visual_mask, visual_slot, 0),
    )
