"""Text-only MLM batches from a text corpus (VL-BERT mixes BooksCorpus + Wikipedia batches
into its visual-linguistic pretraining, so the text side keeps its language modelling).

The corpus is a folder of ``.txt`` files (searched recursively, read in sorted order), one
passage per non-empty line, as those corpora are usually dumped. Each rank reads every
``world_size``-th line from offset ``rank``; an epoch's lines are shuffled in windows of
``WINDOW`` lines by a generator seeded by (seed, rank, epoch). Passages are tokenized, cut to
``max_text_len`` word pieces, and packed into batches of at most ``batch_units`` input units
(B × the longest row). A batch has no image: zero regions, no whole-image RoI (the model's
visual feature embedding of text tokens sees a zero feature), every pair "positive", and
BERT's masking on the text (``mlm-text``).

With ``fixed_width`` (``data.fixed_shapes``) every batch has one shape: rows of that width
(``max_text_len`` + [CLS]/[SEP]), ``batch_units // width`` of them, padded as region batches
are (``fixed_shapes.pad_to_shape``: padding rows and targets flagged invalid). The passages
come in random order, so a batch's longest row is near the cap already on a real corpus.

State for exact resume: (epoch, batches served in it); a restored corpus re-reads the epoch
and passes over the served batches (cheap: text).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch

from vlp.contract import batch_spec as K
from vlp.contract.batch_indices import add_model_indices
from vlp.tasks.masking_text import mask_text
from vlp.tasks.spec import MaskContext

WINDOW = 4096   # lines shuffled together (bounded memory on a large corpus)


class TextCorpusError(ValueError):
    """A text corpus that cannot be read; the message names the path."""


def corpus_files(path: str) -> list[Path]:
    root = Path(path).expanduser()
    if not root.exists():
        raise TextCorpusError(f"text_corpus {path}: no such file or folder")
    files = [root] if root.is_file() else sorted(root.rglob("*.txt"))
    if not files:
        raise TextCorpusError(f"text_corpus {path}: holds no .txt files (one passage a line)")
    return files


class TextCorpusBatches:
    def __init__(self, path: str, tok, ctx: MaskContext, *, max_text_len: int,
                 batch_units: int, feature_dim: int, loc_dim: int, seed: int, rank: int = 0,
                 world_size: int = 1, batch_examples: int = 0, fixed_width: int = 0,
                 mask_prob: float = 0.15):
        self.files = corpus_files(path)
        self.tok, self.ctx = tok, ctx
        self.max_text_len, self.batch_units = max_text_len, batch_units
        self.batch_examples = batch_examples or batch_units   # 0: the units budget alone
        self.feature_dim, self.loc_dim = feature_dim, loc_dim
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch, self.served_in_epoch, self._skip = 0, 0, 0
        self._batches: Iterator[list[np.ndarray]] | None = None
        self.shapes = None   # data.fixed_shapes: one shape, every row ``fixed_width`` wide
        if fixed_width:
            from vlp.datasets.batching.fixed_shapes import ShapeSet
            self.shapes = ShapeSet(batch_units, (fixed_width,), fixed_width, 0, fixed_width, 0,
                                   mask_prob)

    # ---- the stream ---------------------------------------------------------------------

    def _lines(self) -> Iterator[str]:
        k = 0
        for f in self.files:
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    line = line.strip()
                    if not line:
                        continue
                    if k % self.world_size == self.rank:
                        yield line
                    k += 1

    def _epoch_batches(self, epoch: int) -> Iterator[list[np.ndarray]]:
        rng = np.random.default_rng([self.seed, self.rank, 0x7E47, epoch])
        window: list[str] = []
        for line in self._lines():
            window.append(line)
            if len(window) == WINDOW:
                yield from self._pack(window, rng)
                window = []
        if window:
            yield from self._pack(window, rng)

    def _pack(self, lines: list[str], rng: np.random.Generator) -> Iterator[list[np.ndarray]]:
        flat, lengths = self.tok.encode([lines[i] for i in rng.permutation(len(lines))])
        starts = np.concatenate([[0], np.cumsum(lengths)])
        batch: list[np.ndarray] = []
        width = 0
        for i, n in enumerate(lengths):
            if n == 0:
                continue
            ids = flat[starts[i]:starts[i] + min(int(n), self.max_text_len)]
            w = self.shapes.widths[0] if self.shapes else max(width, len(ids) + 2)
            if batch and (w * (len(batch) + 1) > self.batch_units
                          or len(batch) + 1 > self.batch_examples):
                yield batch
                batch, w = [], self.shapes.widths[0] if self.shapes else len(ids) + 2
            batch.append(ids)
            width = w
        if batch:
            yield batch

    def _next_rows(self) -> list[np.ndarray]:
        while True:
            if self._batches is None:
                self._batches = self._epoch_batches(self.epoch)
            rows = next(self._batches, None)
            if rows is not None:
                if self._skip:
                    self._skip -= 1
                    self.served_in_epoch += 1
                    continue
                self.served_in_epoch += 1
                return rows
            if self.served_in_epoch == 0:
                raise TextCorpusError(f"text_corpus {self.files[0].parent}: rank {self.rank} "
                                      f"of {self.world_size} gets no line")
            self.epoch, self.served_in_epoch, self._batches = self.epoch + 1, 0, None

    # ---- the train loop's API ---------------------------------------------------------------

    def next(self) -> dict[str, torch.Tensor]:
        """The next text-only batch, masked for MLM (seeded by its place in its epoch)."""
        rows = self._next_rows()
        rng = np.random.default_rng([self.seed, self.rank, 0x3A5C, self.epoch,
                                     self.served_in_epoch])
        B, T = len(rows), max(len(r) for r in rows) + 2
        ids = np.full((B, T), self.tok.pad_id, np.int64)
        mask = np.zeros((B, T), np.int64)
        for b, r in enumerate(rows):
            ids[b, 0], ids[b, 1:len(r) + 1], ids[b, len(r) + 1] = self.tok.cls_id, r, \
                self.tok.sep_id
            mask[b, :len(r) + 2] = 1
        batch = {K.INPUT_IDS: ids, K.TEXT_MASK: mask, K.POSITIVE: np.ones(B, bool),
                 K.REGION_FEATS: np.zeros((B, 0, self.feature_dim), np.float16),
                 K.REGION_LOC: np.zeros((B, 0, self.loc_dim), np.float32),
                 K.REGION_MASK: np.zeros((B, 0), np.int64),
                 K.IMAGE_FEAT: np.zeros((B, self.feature_dim), np.float32),
                 K.NUM_EXAMPLES: np.array(B, np.int64),
                 K.INPUT_UNITS: np.array(B * T, np.int64)}
        mask_text(batch, rng, self.ctx)
        add_model_indices(batch)   # lengths and loss positions as host data: no device reads
        if self.shapes is not None:
            from vlp.datasets.batching.fixed_shapes import pad_to_shape
            pad_to_shape(batch, self.shapes)
        return {k: torch.from_numpy(np.ascontiguousarray(v)) if v.ndim else torch.tensor(v.item())
                for k, v in batch.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "served_in_epoch": self.served_in_epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch, self._skip = int(state["epoch"]), int(state["served_in_epoch"])
        self.served_in_epoch, self._batches = 0, None
