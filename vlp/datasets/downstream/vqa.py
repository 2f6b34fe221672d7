"""VQA: question + image → soft scores over an answer vocabulary built from training answers.

The vocabulary (UNITER/BUTD: the 3129 most frequent answers of VQA v2) is counted over the
normalised *majority* answer of each training question; an answer enters with at least
``min_count`` questions. Each question's target for answer a is ``score(#annotators who gave
a)`` (0, .3, .6, .9, 1 for 0..≥4 of 10), so the loss sees the annotators' disagreement.
Normalisation and scores are passed in by the caller — the platform hands over the official
evaluator's functions, so training targets and evaluation agree by construction.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from vlp.contract import downstream_keys as D
from vlp.datasets.downstream.base import TableData
from vlp.datasets.downstream.data_errors import DownstreamDataError
from vlp.datasets.downstream.text import TokenizedTexts, text_batch


@dataclass(frozen=True)
class AnswerVocab:
    answers: tuple[str, ...]
    normalize: Callable[[str], str]
    score: Callable[[int], float]

    @classmethod
    def build(cls, answer_lists: list[list[str]], normalize: Callable[[str], str],
              score: Callable[[int], float], max_answers: int = 3129,
              min_count: int = 1) -> "AnswerVocab":
        majority = Counter()
        for answers in answer_lists:
            counts = Counter(normalize(a) for a in answers)
            majority[max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]] += 1
        ranked = sorted((a for a, c in majority.items() if c >= min_count),
                        key=lambda a: (-majority[a], a))[:max_answers]
        if not ranked:
            raise DownstreamDataError(f"no answer is the majority answer of ≥ {min_count} "
                                      f"training questions: the answer vocabulary is empty")
        return cls(tuple(ranked), normalize, score)

    def __len__(self) -> int:
        return len(self.answers)

    def targets(self, answer_lists: list[list[str]]) -> np.ndarray:
        """float32 [Q, A] soft scores."""
        index = {a: i for i, a in enumerate(self.answers)}
        out = np.zeros((len(answer_lists), len(self.answers)), np.float32)
        for q, answers in enumerate(answer_lists):
            for a, c in Counter(self.normalize(x) for x in answers).items():
                if a in index:
                    out[q, index[a]] = self.score(c)
        return out


class VqaData(TableData):
    """``answer_token`` ``cls``: ``[CLS] question [SEP]``, answered from [CLS] (UNITER);
    ``mask``: ``[CLS] question [SEP] [MASK] [SEP]`` with the [MASK] in the answer segment of
    type ``answer_type`` and its position in ``answer_position`` (VL-BERT §4.2.2: "we only
    fill a [MASK] element to the Answer section", answered from the [MASK]'s output)."""

    task = "vqa"

    def __init__(self, cfg, split: str, vocab: AnswerVocab, answer_token: str = "cls",
                 answer_type: int = 0):
        if answer_token not in ("cls", "mask"):
            raise DownstreamDataError(f"VQA answer_token {answer_token!r}: expected cls or mask")
        super().__init__(cfg, split)
        self.vocab = vocab
        self.answer_token, self.answer_type = answer_token, answer_type
        self.questions = self.texts("question")
        self.rows = self.image_rows("image_id")
        self.answers = self.column("answers")
        self.targets = vocab.targets(self.answers)
        # share of training questions whose best answer is in the vocabulary (coverage)
        self.coverage = float((self.targets.max(1) > 0).mean())

    def batch(self, idx: np.ndarray, rng: np.random.Generator | None = None
              ) -> dict[str, torch.Tensor]:
        idx = np.asarray(idx, np.int64)
        labels = {D.TARGETS: self.targets[idx], D.EXAMPLE_INDEX: idx}
        segments = [(self.questions, idx, 0)]
        if self.answer_token == "mask":
            mask = TokenizedTexts(np.array([self.tok.mask_id], np.int32),
                                  np.array([0, 1], np.int64))
            segments.append((mask, np.zeros(len(idx), np.int64), self.answer_type))
            labels[D.ANSWER_POSITION] = self.questions.lengths(idx) + 2   # [CLS] q [SEP]
        text = text_batch(self.tok, segments)
        visual = self.images.visual_arrays(self.rows[idx])
        return self.assemble(text, visual, len(idx), labels)
