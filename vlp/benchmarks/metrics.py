"""Downstream metrics, computed the way the official evaluators compute them.

All scores are returned as percentages (0–100), the unit of UNITER's Table 3.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

# ----------------------------------------------------------------------------- VQA

_NUMBER_WORDS = {"none": "0", "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4",
                 "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9", "ten": "10"}
_ARTICLES = {"a", "an", "the"}
_PUNCT = re.compile(r"[;/\[\]\"{}()=+\\_\-><@`,?!*#%^&$~|:']")
_PERIOD = re.compile(r"(?<!\d)\.(?!\d)")  # a period that is not a decimal point


def normalize_vqa_answer(answer: str) -> str:
    """The official VQA evaluator's answer normalisation: lower case, punctuation removed
    (decimal points kept), number words to digits, articles dropped."""
    a = answer.lower().replace("\n", " ").replace("\t", " ").strip()
    a = _PERIOD.sub("", _PUNCT.sub("", a))
    words = [_NUMBER_WORDS.get(w, w) for w in a.split() if w not in _ARTICLES]
    return " ".join(words)


def vqa_accuracy(prediction: str, answers: Sequence[str]) -> float:
    """Official VQA accuracy of one prediction against the 10 annotator answers: for each
    annotator, min(1, #other annotators agreeing / 3), averaged over the 10 leave-one-out
    subsets (so 3 agreeing annotators give 0.9·1 + 0.1·(2/3)... = 1.0 only from 4 up)."""
    pred = normalize_vqa_answer(prediction)
    gts = [normalize_vqa_answer(a) for a in answers]
    if not gts:
        raise ValueError("vqa_accuracy: no annotator answers")
    matches = [g == pred for g in gts]
    total = sum(matches)
    accs = [min(1.0, (total - m) / 3.0) for m in matches]
    return float(np.mean(accs))


def vqa_target_score(count: int) -> float:
    """Soft training target for an answer given by ``count`` of the 10 annotators (the
    bottom-up-attention / UNITER preprocessing: 0, .3, .6, .9, 1)."""
    return (0.0, 0.3, 0.6, 0.9)[count] if count < 4 else 1.0


def vqa_score(predictions: Sequence[str], answers: Sequence[Sequence[str]]) -> float:
    """Mean official VQA accuracy over questions, in percent."""
    if len(predictions) != len(answers):
        raise ValueError(f"vqa_score: {len(predictions)} predictions for {len(answers)} questions")
    return 100.0 * float(np.mean([vqa_accuracy(p, a) for p, a in zip(predictions, answers)]))


# ----------------------------------------------------------------------------- retrieval

def retrieval_recall(scores: np.ndarray, text_to_image: Sequence[int],
                     ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """R@K for both directions from a score matrix ``scores[text, image]``.

    ``text_to_image[t]`` is the index of caption t's image. Image retrieval (IR): each text
    queries all images; a hit when its own image ranks within K. Text retrieval (TR): each
    image queries all texts; a hit when any of its own captions ranks within K. Each query's
    rank is computed from its own row/column (the reference code's IR counts from the wrong
    column; we do not reproduce that).
    """
    scores = np.asarray(scores, dtype=np.float64)
    t2i = np.asarray(text_to_image)
    n_txt, n_img = scores.shape
    if t2i.shape != (n_txt,):
        raise ValueError(f"retrieval_recall: text_to_image has {t2i.shape[0]} entries, "
                         f"scores has {n_txt} texts")
    # IR: rank of the true image = number of images scoring strictly higher
    true = scores[np.arange(n_txt), t2i]
    ir_rank = (scores > true[:, None]).sum(1)
    # TR: for each image, best rank among its captions
    tr_rank = np.full(n_img, np.iinfo(np.int64).max)
    order = np.argsort(-scores, axis=0, kind="stable")  # per image column: texts by score
    rank_of_text = np.empty_like(order)
    rank_of_text[order, np.arange(n_img)[None, :]] = np.arange(n_txt)[:, None]
    for t, i in enumerate(t2i):
        tr_rank[i] = min(tr_rank[i], rank_of_text[t, i])
    has_caption = tr_rank < np.iinfo(np.int64).max
    out = {}
    for k in ks:
        out[f"ir_r{k}"] = 100.0 * float((ir_rank < k).mean())
        out[f"tr_r{k}"] = 100.0 * float((tr_rank[has_caption] < k).mean())
    out["ir_mean"] = float(np.mean([out[f"ir_r{k}"] for k in ks]))
    out["tr_mean"] = float(np.mean([out[f"tr_r{k}"] for k in ks]))
    return out


# ----------------------------------------------------------------------------- boxes

def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU between boxes a [..., 4] and b [..., 4] (x1, y1, x2, y2), broadcast."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    ix1, iy1 = np.maximum(a[..., 0], b[..., 0]), np.maximum(a[..., 1], b[..., 1])
    ix2, iy2 = np.minimum(a[..., 2], b[..., 2]), np.minimum(a[..., 3], b[..., 3])
    inter = np.clip(ix2 - ix1, 0, None) * np.clip(iy2 - iy1, 0, None)
    area = lambda x: np.clip(x[..., 2] - x[..., 0], 0, None) * np.clip(x[..., 3] - x[..., 1], 0, None)
    union = area(a) + area(b) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def refexp_accuracy(predicted_boxes: np.ndarray, target_boxes: np.ndarray,
                    threshold: float = 0.5) -> float:
    """RE comprehension: a prediction is correct when its box has IoU > threshold with the
    target. Percent."""
    iou = box_iou(np.asarray(predicted_boxes).reshape(-1, 4), np.asarray(target_boxes).reshape(-1, 4))
    return 100.0 * float((iou > threshold).mean())


# ----------------------------------------------------------------------------- classification

def accuracy(predictions: Sequence, labels: Sequence) -> float:
    """Plain accuracy in percent (NLVR2, SNLI-VE, VCR)."""
    p, y = np.asarray(predictions), np.asarray(labels)
    if p.shape != y.shape:
        raise ValueError(f"accuracy: {p.shape} predictions vs {y.shape} labels")
    return 100.0 * float((p == y).mean())


def vcr_scores(answer_pred: Sequence[int], answer_label: Sequence[int],
               rationale_pred: Sequence[int], rationale_label: Sequence[int]) -> dict[str, float]:
    """VCR: Q→A, QA→R (rationale given the right answer) and the holistic Q→AR (both right)."""
    qa = np.asarray(answer_pred) == np.asarray(answer_label)
    qar_r = np.asarray(rationale_pred) == np.asarray(rationale_label)
    return {"q2a": 100.0 * float(qa.mean()), "qa2r": 100.0 * float(qar_r.mean()),
            "q2ar": 100.0 * float((qa & qar_r).mean())}


# ----------------------------------------------------------------------------- Meta-Sum

META_SUM_PARTS = ("vqa", "ir", "tr", "nlvr2", "refcoco+")


def meta_sum(scores: Mapping[str, float]) -> float:
    """UNITER Table 3's Meta-Sum: VQA score + IR mean(R@1,5,10) + TR mean(R@1,5,10) +
    NLVR2 accuracy + RefCOCO+ accuracy on detected boxes (each in percent)."""
    missing = [k for k in META_SUM_PARTS if k not in scores]
    if missing:
        raise KeyError(f"meta_sum needs scores for {list(META_SUM_PARTS)}; missing {missing}")
    return float(sum(float(scores[k]) for k in META_SUM_PARTS))
