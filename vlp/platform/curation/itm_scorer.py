"""``ItmScorer``: P(match) of (image, text) pairs from a vlp model's ITM head.

The pairs go through the pretraining pipeline's own pieces (``ImageRowTransform`` for region
selection, location features and tokenization, ``collate_examples`` for the batch contract),
so the model sees exactly the input it was trained on; only the texts are the curated ones
instead of the shard's. Images are read back one shard at a time (``PairTable`` holds no
features).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from vlp.contract import batch_spec as K
from vlp.datasets.batching.collate import ExampleRefs, collate_examples
from vlp.platform.curation.itm_checkpoint import ItmCheckpointError, ScoringModel
from vlp.platform.curation.pairs import PairTable
from vlp.datasets.stream.data_config import DataConfig, PixelConfig, SourceConfig
from vlp.datasets.stream.data_plan import PIXEL_COLUMNS, REGION_COLUMNS, DataPlan
from vlp.datasets.batching.image_block import ImageBlock
from vlp.datasets.stream.image_rows import ImageRowTransform
from vlp.datasets.batching.task_batch import to_torch, whole_image_feature
from vlp.datasets.storage.shards import read_image_shard
from vlp.datasets.stream.text_tokenizer import load_tokenizer, resolve_tokenizer_path

# PreprocessSpec.location_kind → DataConfig.location (the model's name → the pipeline's)
LOCATION_OF_KIND = {"uniter7": "uniter", "imagebert5": "imagebert", "box4": "vlbert"}
MAX_TEXT_LEN = 60   # UNITER's pretraining caption limit; longer texts are scored truncated


class ItmScorer:
    def __init__(self, scoring: ScoringModel, *, batch_size: int = 64,
                 feature_dim: int, num_classes: int | None, device: str = "cpu",
                 tokenizer_path: str | None = None):
        self.scoring = scoring
        self.batch_size = batch_size
        self.device = torch.device(device)
        spec = scoring.preprocess
        vocab = tokenizer_path or spec.vocab_file
        if vocab is None:   # e.g. the UNITER release: bert-base-cased, 28996 tokens
            raise ItmCheckpointError(
                f"{scoring.source}: the model's vocabulary ({spec.vocab_size} tokens) is not "
                f"the packaged uncased one: pass the tokenizer it was trained with "
                f"(--tokenizer, a folder with tokenizer.json or vocab.txt)")
        visual = spec.input_kind
        pixels = PixelConfig() if visual == "regions" else PixelConfig(
            shorter_side=spec.image_min_side, longer_max=spec.image_max_side,
            mean=spec.pixel_mean, std=spec.pixel_std)
        config = DataConfig(sources=(SourceConfig("curation", "-"),), split=None,
                            max_text_len=min(MAX_TEXT_LEN, spec.max_text_positions - 2),
                            overlong="truncate",
                            location=LOCATION_OF_KIND.get(spec.location_kind, "uniter"),
                            image_feat=spec.needs_image_feat, visual=visual, pixels=pixels)
        self.plan = DataPlan(config, ("itm",), (), feature_dim=feature_dim,
                             num_classes=num_classes,
                             tokenizer_path=str(resolve_tokenizer_path(vocab)),
                             read_columns=REGION_COLUMNS if visual == "regions"
                             else PIXEL_COLUMNS, needs_soft_labels=False)
        self.transform = ImageRowTransform(self.plan)
        self.tok = load_tokenizer(self.plan.tokenizer_path)
        if self.tok.vocab_size != spec.vocab_size:
            raise ItmCheckpointError(f"{self.plan.tokenizer_path}: {self.tok.vocab_size} "
                                     f"tokens, but the model embeds {spec.vocab_size}")

    def score(self, pairs: PairTable, which: np.ndarray) -> np.ndarray:
        """P(match) for the pairs ``which`` (indices), in that order."""
        out = np.full(len(which), np.nan)
        position = {int(p): k for k, p in enumerate(which)}
        by_file: dict[int, list[int]] = {}
        for p in which:
            by_file.setdefault(int(pairs.image_file[pairs.image[p]]), []).append(int(p))
        for f, members in sorted(by_file.items()):
            scores = self._score_shard(pairs, pairs.files[f], members)
            for p, s in zip(members, scores):
                out[position[p]] = s
        return out

    def _score_shard(self, pairs: PairTable, path: Path, members: list[int]) -> np.ndarray:
        table, _ = read_image_shard(path, check_values=False)
        images = list(dict.fromkeys(int(pairs.image[p]) for p in members))
        slot = {i: k for k, i in enumerate(images)}
        texts: list[list[str]] = [[] for _ in images]
        cap_of = np.zeros(len(members), np.int64)
        for k, p in enumerate(members):
            bucket = texts[slot[int(pairs.image[p])]]
            cap_of[k] = len(bucket)
            bucket.append(pairs.text[p])
        rows = table.take(pa.array(pairs.image_row[images]))
        rows = rows.set_column(rows.column_names.index("captions"), "captions",
                               pa.array(texts, pa.list_(pa.string())))
        block = ImageBlock.from_table(self.transform(rows, source_index=0),
                                      self.plan.feature_dim, self.plan.num_classes,
                                      self.plan.loc_dim)
        image_of = np.array([slot[int(pairs.image[p])] for p in members], np.int64)
        scores = np.zeros(len(members))
        zeros = np.zeros(len(members), np.int64)
        for start in range(0, len(members), self.batch_size):
            sl = slice(start, start + self.batch_size)
            refs = ExampleRefs(zeros[sl], image_of[sl], cap_of[sl], zeros[sl], image_of[sl],
                               np.ones(len(image_of[sl]), bool))
            scores[sl] = self._predict(block, refs)
        return scores

    def _predict(self, block: ImageBlock, refs: ExampleRefs) -> np.ndarray:
        from vlp.models import predict
        cfg = self.plan.config
        batch = collate_examples({0: block}, refs, self.tok, visual=cfg.visual,
                                 feature_dim=self.plan.feature_dim, loc_dim=self.plan.loc_dim,
                                 num_classes=self.plan.num_classes, need_soft=False,
                                 pixel_cfg=cfg.pixels)
        if cfg.image_feat and cfg.visual == "regions":
            batch[K.IMAGE_FEAT] = whole_image_feature(batch)
        tensors = {k: v.to(self.device) for k, v in to_torch(batch).items()}
        return predict(self.scoring.model, tensors)["itm_score"].float().cpu().numpy()
