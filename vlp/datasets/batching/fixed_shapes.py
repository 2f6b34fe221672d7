"""Fixed batch shapes (``data.fixed_shapes``): every region micro-batch in one of a few shapes,
so that a step can be captured once per shape (CUDA graphs) and replayed.

A shape is set by the batch's packed row width W, taken from a short ladder of widths: the
batch has ``budget // W`` rows, text tensors ``min(W, text_cap)`` columns, region tensors
``min(W, region_cap)`` columns, and its target lists (``MLM_TARGETS``, ``REGION_TARGETS``) a
length that is a function of W alone. The window is cut with each batch costing rows × its
width rounded up the ladder (``length_buckets.bucket_batches(widths=...)``), so a batch never
has more rows than its shape; ``pad_to_shape`` then pads it:

- padding rows: one [PAD] token and one zero region each (a row with nothing to attend to
  gives NaN in SDPA, and NaN times a zero weight is still NaN), not a true pair, no ITM
  label that counts: ``ROW_VALID`` is False there;
- padding columns: [PAD] / zero features, masks 0, labels ``-100``;
- padding targets: (0, 0), with ``MLM_TARGET_VALID`` / ``REGION_TARGET_VALID`` False; the
  losses are weighted means over the valid entries (``vlp.tasks.losses.weighted_mean``), so
  a padded batch's losses and gradients are those of the same examples unpadded.

The ladder is fitted to the first window the batcher cuts (the widths that minimise the
padding of its rows, ``fit_widths``), with the longest row the config allows as a last rung
for rows longer than any seen then; it is part of the batcher's state (checkpoints resume with
the same shapes). Target caps cover a binomial draw at the mask probability over the longest
texts (regions) the fit saw, plus the rows' one forced position; a batch that draws more
targets than that takes the cap that holds every position (a rare extra shape, counted in
``stats["shape_target_overflow"]``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from vlp.contract import batch_spec as K

ROW_KEYS_FILL = {K.ITM_LABELS: 0, K.POSITIVE: False, K.IMAGE_FEAT: 0,
                 "example_image_key": -1, "example_text_key": -1}
TEXT_KEYS_FILL = {K.INPUT_IDS: 0, K.TEXT_MASK: 0, K.MLM_LABELS: -100, K.TEXT_TYPE_IDS: 0}
REGION_KEYS_FILL = {K.REGION_FEATS: 0, K.REGION_LOC: 0, K.REGION_MASK: 0,
                    K.REGION_MASKED: False, K.REGION_ZEROED: False,
                    K.REGION_FEAT_TARGETS: 0, K.REGION_SOFT_LABELS: 0,
                    K.REGION_CLASS_LABELS: -100, K.REGION_TYPE_IDS: 0}
TARGET_KEYS = {K.MLM_TARGETS: K.MLM_TARGET_VALID, K.REGION_TARGETS: K.REGION_TARGET_VALID}
SCALAR_KEYS = (K.NUM_EXAMPLES, K.INPUT_UNITS, K.ROW_LENGTH, K.REAL_UNITS)


@dataclass(frozen=True)
class ShapeSet:
    """The shapes of a run's region batches (see the module docstring)."""
    budget: int                  # input units per batch (``batch_units``)
    widths: tuple[int, ...]      # packed row widths, ascending; the last holds any row
    text_cap: int                # the widest text tensor (max_text_len + [CLS]/[SEP])
    region_cap: int              # the widest region tensor (the most regions per image)
    text_fit: int                # the longest text (with [CLS]/[SEP]) in the fitted window
    region_fit: int              # the most regions of one image in the fitted window
    mask_prob: float

    def width(self, row: int) -> int:
        """The ladder's width for a batch whose longest packed row is ``row``."""
        i = int(np.searchsorted(self.widths, row))
        if i == len(self.widths):
            raise ValueError(f"a row of {row} input units is longer than the fixed shapes' "
                             f"widest ({self.widths[-1]}): data.max_text_len or "
                             f"data.regions changed after the shapes were fitted?")
        return self.widths[i]

    def rows(self, width: int) -> int:
        return self.budget // width

    def text_len(self, width: int) -> int:
        return min(width, self.text_cap)

    def regions(self, width: int) -> int:
        return min(width, self.region_cap)

    def text_targets(self, width: int) -> int:
        rows = self.rows(width)
        words = max(min(self.text_fit, width) - 2, 1)
        return _target_cap(rows, words, self.mask_prob, rows * (self.text_len(width) - 2))

    def region_targets(self, width: int) -> int:
        rows = self.rows(width)
        regions = max(min(self.region_fit, width), 1)
        return _target_cap(rows, regions, self.mask_prob, rows * self.regions(width))

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> "ShapeSet":
        return cls(**{**state, "widths": tuple(int(w) for w in state["widths"])})


def _target_cap(rows: int, per_row: int, p: float, bound: int) -> int:
    """Targets a batch of ``rows`` rows of up to ``per_row`` maskable positions draws, with
    room to spare: the mean, 4 standard deviations and a quarter of the rows (each row gets
    one position when its draw is empty), rounded up to 32; never above ``bound`` (every
    position), never below 1."""
    n = rows * per_row
    mean = p * n
    cap = mean + 4 * math.sqrt(mean * (1 - p)) + rows / 4
    return max(1, min(bound, 32 * math.ceil(cap / 32)))


def fit_widths(lengths: np.ndarray, count: int, widest: int = 0) -> list[int]:
    """At most ``count`` widths that minimise Σ (width − length) over ``lengths`` when each
    length is padded to the smallest width that holds it (dynamic programming over the
    distinct lengths; the largest length is always a width). ``widest``, where longer than
    every length, is the largest width, and the others are chosen knowing it."""
    vals, counts = np.unique(np.asarray(lengths, np.int64), return_counts=True)
    if len(vals) and widest > vals[-1]:   # a length nothing has: free, it ends the ladder
        vals, counts = np.append(vals, widest), np.append(counts, 0)
    m = len(vals)
    if m <= count:
        return vals.tolist()
    cs = np.concatenate([[0], np.cumsum(counts)]).astype(np.float64)
    ws = np.concatenate([[0], np.cumsum(counts * vals)]).astype(np.float64)

    def cost(i: np.ndarray, j: int) -> np.ndarray:   # items vals[i..j] padded to vals[j]
        return vals[j] * (cs[j + 1] - cs[i]) - (ws[j + 1] - ws[i])

    best = np.array([cost(np.array(0), j) for j in range(m)], np.float64)
    choice = []   # choice[q][j]: first item of the last group with q + 2 widths
    for _ in range(count - 1):
        new, arg = best.copy(), np.zeros(m, np.int64)
        for j in range(1, m):
            i = np.arange(1, j + 1)
            c = best[i - 1] + cost(i, j)
            k = int(np.argmin(c))
            if c[k] < new[j]:
                new[j], arg[j] = c[k], i[k]
        choice.append(arg)
        best = new
    widths, j = [], m - 1
    for arg in reversed(choice):
        if arg[j] == 0:   # as good with one group fewer: the same j, one level down
            continue
        widths.append(int(vals[j]))
        j = int(arg[j]) - 1
    widths.append(int(vals[j]))   # the first group: lengths 0..j
    return sorted(set(widths))


def fit_shapes(text_len: np.ndarray, regions: np.ndarray, *, budget: int, count: int,
               text_cap: int, region_cap: int, mask_prob: float) -> ShapeSet:
    """The shapes for rows like these (a window's: text with [CLS]/[SEP], regions)."""
    # the widest fitted: the longest text with the most regions seen (a later row may pair
    # them), the others fitted below it; then the longest the config allows
    top = text_cap + region_cap
    widths = fit_widths(np.asarray(text_len) + np.asarray(regions), count,
                        widest=min(int(np.max(text_len)) + int(np.max(regions)), top))
    if widths[-1] < top:
        widths.append(top)   # rows longer than any fitted: rare, one more shape
    return ShapeSet(budget, tuple(int(w) for w in widths), text_cap, region_cap,
                    int(np.max(text_len)), int(np.max(regions)), mask_prob)


def pad_to_shape(batch: dict[str, np.ndarray], shapes: ShapeSet,
                 stats: Counter | None = None) -> None:
    """Pad a masked region batch (numpy, after ``add_model_indices``) to its shape, in place;
    adds ``ROW_VALID`` and the targets' valid flags, sets ``ROW_LENGTH`` to the shape's width
    and ``INPUT_UNITS`` to rows × width (``NUM_EXAMPLES`` and ``REAL_UNITS`` stay the real
    counts)."""
    rows_now = len(batch[K.POSITIVE])
    width = shapes.width(int(batch[K.ROW_LENGTH]))
    rows, t_len, n_len = shapes.rows(width), shapes.text_len(width), shapes.regions(width)
    if rows_now > rows:
        raise ValueError(f"a batch of {rows_now} rows of width {width} exceeds its shape's "
                         f"{rows} rows (cut without the fixed widths?)")
    for key in list(batch):
        value = batch[key]
        if key.startswith("_") or key in SCALAR_KEYS:
            continue
        if key in TARGET_KEYS:
            cap = (shapes.text_targets if key == K.MLM_TARGETS else shapes.region_targets)(width)
            have = value.shape[1]
            if have > cap:
                cap = rows * (t_len - 2 if key == K.MLM_TARGETS else n_len)
                if stats is not None:
                    stats["shape_target_overflow"] += 1
            valid = np.zeros(cap, bool)
            valid[:have] = True
            out = np.zeros((2, cap), value.dtype)
            out[:, :have] = value
            batch[key], batch[TARGET_KEYS[key]] = out, valid
        elif key in TEXT_KEYS_FILL:
            batch[key] = _pad(value, (rows, t_len) + value.shape[2:], TEXT_KEYS_FILL[key])
        elif key in REGION_KEYS_FILL:
            batch[key] = _pad(value, (rows, n_len) + value.shape[2:], REGION_KEYS_FILL[key])
        elif key in ROW_KEYS_FILL:
            batch[key] = _pad(value, (rows,) + value.shape[1:], ROW_KEYS_FILL[key])
        else:
            raise ValueError(f"fixed shapes: no padding rule for batch key {key!r} "
                             f"(add it to vlp/datasets/batching/fixed_shapes.py)")
    # padding rows: one token and one region each, so that attention has a key to attend to
    batch[K.TEXT_MASK][rows_now:, 0] = 1
    if K.REGION_MASK in batch and batch[K.REGION_MASK].shape[1]:   # text-only: no regions
        batch[K.REGION_MASK][rows_now:, 0] = 1
    valid = np.zeros(rows, bool)
    valid[:rows_now] = True
    batch[K.ROW_VALID] = valid
    batch[K.ROW_LENGTH] = np.array(width, np.int64)
    batch[K.INPUT_UNITS] = np.array(rows * width, np.int64)


def _pad(value: np.ndarray, shape: tuple[int, ...], fill) -> np.ndarray:
    if value.shape == shape:
        return value
    out = np.full(shape, fill, value.dtype)
    out[tuple(slice(0, s) for s in value.shape)] = value
    return out


def batch_signature(batch) -> tuple:
    """(key, shape) of every tensor of a batch (host integers left out): the batches of one
    task with equal signatures replay one captured step."""
    return tuple(sorted((k, tuple(v.shape)) for k, v in batch.items()
                        if hasattr(v, "shape") and k not in (K.ROW_LENGTH, K.REAL_UNITS,
                                                             K.NUM_EXAMPLES, K.INPUT_UNITS))
                 ) + ((K.ROW_LENGTH, int(batch[K.ROW_LENGTH])),)


__all__ = ["ShapeSet", "fit_shapes", "fit_widths", "pad_to_shape", "batch_signature"]
