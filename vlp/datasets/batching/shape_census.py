"""What a run of batches looks like to a captured step: distinct tensor shapes per task and the
share of input units that are padding (``data.fixed_shapes``' cost). Used by
``jobs/benchmarks/padding_waste.py --real-shapes`` and its test."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from vlp.contract import batch_spec as K
from vlp.datasets.batching.fixed_shapes import batch_signature


@dataclass
class ShapeCensus:
    shapes: dict[str, set] = field(default_factory=lambda: defaultdict(set))
    batches: int = 0
    real_units: int = 0          # Σ text + regions of the real rows
    input_units: int = 0         # Σ rows × packed width: what the model computes on
    targets: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    def add(self, task: str, batch: dict) -> None:
        self.batches += 1
        self.shapes[task].add(batch_signature(batch))
        self.real_units += int(batch[K.REAL_UNITS])
        self.input_units += int(batch[K.INPUT_UNITS])
        for key in (K.MLM_TARGETS, K.REGION_TARGETS):
            if key in batch:
                valid = batch.get(K.MLM_TARGET_VALID if key == K.MLM_TARGETS
                                  else K.REGION_TARGET_VALID)
                real = int(valid.sum()) if valid is not None else batch[key].shape[1]
                self.targets[key][0] += real
                self.targets[key][1] += batch[key].shape[1]

    @property
    def padding(self) -> float:
        """Share of the input units that are padding."""
        return 1.0 - self.real_units / self.input_units if self.input_units else 0.0

    def most_shapes(self) -> int:
        return max((len(s) for s in self.shapes.values()), default=0)

    def figures(self) -> dict[str, float]:
        out = {"batches": self.batches, "padding_share": self.padding,
               "most_shapes_per_task": self.most_shapes()}
        for task, sigs in sorted(self.shapes.items()):
            out[f"shapes_{task}"] = len(sigs)
        for key, (real, padded) in sorted(self.targets.items()):
            out[f"{key}_padding_share"] = 1.0 - real / padded if padded else 0.0
        return out


def census(sampler, source, n: int) -> ShapeCensus:
    """``n`` batches of ``source`` (a ``PretrainBatches``), tasks drawn by ``sampler``."""
    c = ShapeCensus()
    for _ in range(n):
        task = sampler.next()
        c.add(task, source.next(task))
    return c


@dataclass
class WidthCensus:
    """The shapes of many batches from their lengths alone (no collate, no masking): what the
    batcher cuts, batch by batch. With ``data.fixed_shapes`` a padded batch's every tensor
    shape is a function of its task and width (``pad_to_shape``; tests/test_fixed_shapes.py
    checks it on built batches), so the distinct widths a task gets are its distinct shapes;
    without, a batch is its rows × its longest row (today's batching)."""
    widths: dict[str, set] = field(default_factory=lambda: defaultdict(set))
    batches: int = 0
    real_units: int = 0          # Σ text + regions of the rows
    input_units: int = 0         # Σ the shape's rows × its width (empty rows included)
    row_units: int = 0           # Σ real rows × the batch's width (empty rows left out)
    lengths: list = field(default_factory=list)   # every row's length, for the floor

    @property
    def padding(self) -> float:
        """Share of the input units that are padding: 1 − Σ real / Σ rows × width."""
        return 1.0 - self.real_units / self.input_units if self.input_units else 0.0

    def floor(self, count: int) -> float:
        """The least padding ``count`` widths can give these rows, every batch full: each row
        padded to the smallest of the best ``count`` widths for them (``fit_widths``)."""
        import numpy as np

        from vlp.datasets.batching.fixed_shapes import fit_widths

        rows = np.concatenate(self.lengths)
        ws = np.asarray(fit_widths(rows, count))
        pad = int((ws[np.searchsorted(ws, rows)] - rows).sum())
        return pad / (pad + int(rows.sum()))

    def figures(self) -> dict[str, float]:
        out = {"batches": self.batches, "padding_share": self.padding,
               "padding_share_in_rows": 1.0 - self.real_units / self.row_units,
               "padding_share_empty_rows": 1.0 - self.row_units / self.input_units,
               "most_shapes_per_task": max(len(w) for w in self.widths.values())}
        for task, w in sorted(self.widths.items()):
            out[f"shapes_{task}"] = len(w)
        return out


def width_census(plan, blocks, sampler, n: int, seed: int = 0) -> tuple[WidthCensus, object]:
    """``n`` batches cut by the batcher's own window (``ExampleWindow``) from ``blocks``
    (``ImageBlock``s, cycled as one long epoch in a fresh order each pass), tasks drawn by
    ``sampler``; returns the census and the fitted ``ShapeSet`` (None without
    ``data.fixed_shapes``: then the census is of today's batching, for comparison)."""
    import numpy as np

    from vlp.datasets.batching.example_window import ExampleWindow

    cfg = plan.config
    rng = np.random.default_rng([seed, 0xCE45])
    window = ExampleWindow(plan, np.random.default_rng([seed, 0x5EED]))
    live = dict(enumerate(blocks))
    c, ready, next_id = WidthCensus(), [], 0
    while c.batches < n:
        while not ready:
            for b in rng.permutation(len(blocks)):
                live[next_id] = blocks[int(b)]
                window.ingest(next_id, blocks[int(b)])
                next_id += 1
                if window.pending_examples >= cfg.bucket_window:
                    ready += window.cut_refs(live, final=False)
        refs = ready.pop(0)
        shapes = window.shapes
        text = np.zeros(len(refs), np.int64)
        regions = np.zeros(len(refs), np.int64)
        for b in np.unique(refs.text_block):
            sel = refs.text_block == b
            blk = live[int(b)]
            g = blk.cap_start[refs.text_row[sel]] + refs.text_cap[sel]
            text[sel] = blk.tok_start[g + 1] - blk.tok_start[g] + 2
            regions[sel] = blk.num_regions[refs.image_row[sel]]
        row = text + regions
        width = shapes.width(int(row.max())) if shapes else int(row.max())
        c.batches += 1
        c.widths[sampler.next()].add(width)
        c.real_units += int(row.sum())
        c.row_units += len(row) * width
        c.input_units += (shapes.rows(width) if shapes else len(row)) * width
        c.lengths.append(row)
    return c, window.shapes
