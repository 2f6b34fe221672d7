"""What the model needs as host integers or index tensors, computed on the host from a
pipeline batch (numpy arrays, after masking): the packed row's length and the positions each
masked-modeling loss is computed on (``batch_spec``'s ROW_LENGTH, MLM_TARGETS,
REGION_TARGETS).

Without them the model learns these from device tensors (``int(lengths.max())``, boolean-mask
indexing, ``.any()``), and each such read makes the host wait for the device: the host cannot
queue the next kernels while the device works, and ``torch.compile`` breaks its graph there.
The collate has the masks on the host anyway.
"""

from __future__ import annotations

import numpy as np

from vlp.contract import batch_spec as bs


def add_model_indices(batch: dict[str, np.ndarray]) -> None:
    """Add ROW_LENGTH (region batches), REAL_UNITS, MLM_TARGETS and REGION_TARGETS (where the
    batch has their masks) to ``batch`` in place."""
    text_mask = batch.get(bs.TEXT_MASK)
    positive = batch.get(bs.POSITIVE)
    rows = None if text_mask is None else text_mask.shape[0]
    if positive is None and rows is not None:
        positive = np.ones(rows, dtype=bool)
    region_mask = batch.get(bs.REGION_MASK)
    if text_mask is not None and region_mask is not None and bs.PIXELS not in batch:
        length = (text_mask != 0).sum(1) + (region_mask != 0).sum(1)
        batch[bs.ROW_LENGTH] = np.array(int(length.max()) if len(length) else 0, np.int64)
    elif text_mask is not None and bs.PIXELS in batch and bs.INPUT_UNITS in batch and rows:
        # B × (T + cells of the padded image): the collate's count, which the model's grid has
        batch[bs.ROW_LENGTH] = np.array(int(batch[bs.INPUT_UNITS]) // rows, np.int64)
    if text_mask is not None:
        real = int((text_mask != 0).sum())
        if region_mask is not None and bs.PIXELS not in batch:
            real += int((region_mask != 0).sum())
        elif bs.PIXELS in batch and bs.INPUT_UNITS in batch and rows:
            # a pixel batch's units are B × (T + cells): every cell of the padded image counts
            real += rows * (int(batch[bs.INPUT_UNITS]) // rows - text_mask.shape[1])
        batch[bs.REAL_UNITS] = np.array(real, np.int64)
    labels = batch.get(bs.MLM_LABELS)
    if labels is not None and text_mask is not None:
        select = (labels != -100) & (text_mask != 0) & positive.astype(bool)[:, None]
        batch[bs.MLM_TARGETS] = np.stack(np.nonzero(select)).astype(np.int64)
    masked = batch.get(bs.REGION_MASKED)
    if masked is not None and region_mask is not None:
        select = masked.astype(bool) & (region_mask != 0) & positive.astype(bool)[:, None]
        classes = batch.get(bs.REGION_CLASS_LABELS)
        if classes is not None:
            select &= classes != -100
        batch[bs.REGION_TARGETS] = np.stack(np.nonzero(select)).astype(np.int64)
