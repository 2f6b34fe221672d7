"""Image–text retrieval, Flickr30K-style (UNITER §4.1 / Appendix; ImageBERT §4.4).

Finetuning: the match score of the pooled [CLS] (initialised from the pretrained ITM head),
1 positive + k negatives per side, loss ``margin`` (UNITER, 0.2 on sigmoid scores), ``binary``
(ImageBERT's best), ``mce`` or ``triplet`` (ImageBERT's comparison), or ``in-batch-binary``
(SOHO: every caption of the mini-batch against every image of it); optional on-the-fly hard negatives (UNITER:
score ``hard_candidates`` per side without gradients, train on the top k). Evaluation scores
every (text, image) pair of the split (``eval_images``: of its first N images and their
captions, a smaller gallery, as COCO's 1K test), texts sharded over the workers; IR and TR
R@1/5/10, each query ranked in its own row / column. ``vlp evaluate`` runs the same evaluation
zero-shot, straight from the ITM head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field

from vlp.datasets.downstream.retrieval import RetrievalData
from vlp.models.heads import build_head
from vlp.models.heads.retrieval_losses import IN_BATCH_LOSSES
from vlp.contract.config_loader import ConfigModel
from vlp.benchmarks.base import Benchmark, EvalResult, TrainDefaults, hidden_size
from vlp.benchmarks.registry import register

TOP = 10


class RetrievalOptions(ConfigModel):
    # the protocol (vlp.benchmarks.protocols): a family's finetune defaults to its paper's
    loss: Literal["margin", "binary", "in-batch-binary", "mce", "triplet"] = "margin"
    margin: float = Field(0.2, gt=0)
    negatives: int = Field(1, gt=0)          # per side per positive (UNITER: 1 + 1)
    hard_negatives: bool = False               # mine the top ``negatives`` of the candidates
    hard_candidates: int = Field(16, gt=1)   # candidates per side scored without gradients
    eval_pairs_per_batch: int = Field(512, gt=0)
    eval_images: int = Field(0, ge=0)          # 0 = the split's gallery; N = its first N images

    def validate(self):
        if self.loss in IN_BATCH_LOSSES and self.hard_negatives:
            yield "hard_negatives", (f"the {self.loss} loss takes the mini-batch's own "
                                     f"captions as negatives; none are mined")
        if self.hard_negatives and self.hard_candidates <= self.negatives:
            yield "hard_candidates", (f"is {self.hard_candidates}: expected more candidates "
                                      f"than the {self.negatives} negatives kept")


@register
class Retrieval(Benchmark):
    name = "retrieval"
    table = "retrieval"
    description = "Flickr30K-style image retrieval (IR) and text retrieval (TR), R@1/5/10"
    defaults = TrainDefaults(steps=600, batch_size=16, lr=5e-5)
    Options = RetrievalOptions
    primary = "r_mean"
    protocol_option = "loss"

    def train_data(self, ctx):
        o = ctx.options
        return RetrievalData(ctx.data, "train", o.negatives,
                             o.hard_candidates if o.hard_negatives else 0,
                             in_batch=o.loss in IN_BATCH_LOSSES)

    def eval_data(self, ctx):
        return RetrievalData(ctx.data, ctx.eval_split, max_images=ctx.options.eval_images)

    def build_head(self, ctx, backbone, itm_head):
        o = ctx.options
        return build_head("match-scorer", name=self.task, hidden=hidden_size(ctx), loss=o.loss,
                          margin=o.margin, itm_head=itm_head)

    def evaluate(self, ctx, data: RetrievalData, runner) -> EvalResult | None:
        scores = score_matrix(data, runner, ctx.options.eval_pairs_per_batch)
        if scores is None:
            return None
        return recall_result(data, scores)


def score_matrix(data: RetrievalData, runner, pairs_per_batch: int) -> np.ndarray | None:
    """scores[text, image] over the split; this rank scores its block of texts against every
    image; rank 0 receives the full matrix."""
    n_img = len(data.image_ids)
    texts = runner.shard(len(data))

    def make(items: np.ndarray):
        return data.pair_batch(texts[items // n_img], items % n_img)

    local = runner.predict(make, np.arange(len(texts) * n_img), pairs_per_batch)
    parts = runner.gather(local.reshape(len(texts), n_img))
    return None if parts is None else runner.count_nonfinite(np.concatenate(parts, 0))


def recall_result(data: RetrievalData, scores: np.ndarray) -> EvalResult:
    metrics = retrieval_recall(scores, data.text_to_image)
    metrics["r_mean"] = (metrics["ir_mean"] + metrics["tr_mean"]) / 2
    caption_ids, image_ids = data.column("caption_id"), data.image_ids
    ranked = np.where(np.isfinite(scores), scores, -np.inf)   # non-finite: last
    top_img = np.argsort(-ranked, axis=1, kind="stable")[:, :TOP]
    top_txt = np.argsort(-ranked, axis=0, kind="stable")[:TOP].T
    true = ranked[np.arange(len(scores)), data.text_to_image]
    ir_rank = np.where(np.isfinite(true), (ranked > true[:, None]).sum(1), len(image_ids))
    preds = [{"query": "text", "caption_id": c, "rank_of_image": int(r),
              "top_images": [image_ids[j] for j in row]}
             for c, r, row in zip(caption_ids, ir_rank, top_img)]
    preds += [{"query": "image", "image_id": i, "top_captions": [caption_ids[j] for j in row]}
              for i, row in zip(image_ids, top_txt)]
    return EvalResult(metrics, preds)


def retrieval_recall(scores: np.ndarray, text_to_image: Sequence[int],
                     ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """R@K for both directions from a score matrix ``scores[text, image]``, ties broken at
    random (each query's expected recall).

    ``text_to_image[t]`` is the index of caption t's image. Image retrieval (IR): each text
    queries all images; a hit when its own image ranks within K. Text retrieval (TR): each
    image queries all texts; a hit when any of its own captions ranks within K. Each query's
    rank is computed from its own row/column (the reference code's IR counts from the wrong
    column; we do not reproduce that).

    Ties: the standard evaluation sorts (topk) and so breaks ties by an arbitrary order; we
    score the expectation of that over a uniformly random order, so a model that gives every
    pair one score gets chance, R@K = K/N for IR (and 1 - C(N-c, K)/C(N, K) for TR, an
    image with c captions among N texts) — not 100 (ties for the model, counting only
    strictly higher scores) nor 0 (ties against it). Untied scores rank as before.

    Non-finite scores (NaN, ±inf) score nothing: they rank below every finite score and are
    never a hit, so a query whose true pair's score is not finite scores 0 (NaN compares
    false with everything, which used to leave a NaN query counted as ranked first).
    """
    scores = np.asarray(scores, dtype=np.float64)
    t2i = np.asarray(text_to_image)
    n_txt, n_img = scores.shape
    if t2i.shape != (n_txt,):
        raise ValueError(f"retrieval_recall: text_to_image has {t2i.shape[0]} entries, "
                         f"scores has {n_txt} texts")
    # non-finite scores rank below every finite one (-inf, compared strictly) and never hit
    finite = np.isfinite(scores)
    scores = np.where(finite, scores, -np.inf)
    # IR: the true image sits uniformly among its ties, after the images scoring higher
    true = scores[np.arange(n_txt), t2i]
    true_finite = finite[np.arange(n_txt), t2i]
    above = (scores > true[:, None]).sum(1)
    tied = np.maximum((scores == true[:, None]).sum(1), 1)      # including the true image
    # TR: per image, the group of texts tied at its best own caption's score
    tr_above, tr_tied, tr_own = [], [], []
    for i in range(n_img):
        own = t2i == i
        if not own.any():
            continue
        column = scores[:, i]
        if not finite[own, i].any():                 # no own caption scored: a miss
            tr_above.append(n_txt)
            tr_tied.append(1)
            tr_own.append(1)
            continue
        best = column[own].max()
        tr_above.append(int((column > best).sum()))
        tr_tied.append(int((column == best).sum()))
        tr_own.append(int((column[own] == best).sum()))
    out = {}
    for k in ks:
        ir_hit = np.where(true_finite, np.clip(k - above, 0, tied) / tied, 0.0)
        tr_hit = [hit_in_tied_group(k - a, m, j) for a, m, j in zip(tr_above, tr_tied, tr_own)]
        out[f"ir_r{k}"] = 100.0 * float(ir_hit.mean())
        out[f"tr_r{k}"] = 100.0 * float(np.mean(tr_hit))
    out["ir_mean"] = float(np.mean([out[f"ir_r{k}"] for k in ks]))
    out["tr_mean"] = float(np.mean([out[f"tr_r{k}"] for k in ks]))
    return out


def hit_in_tied_group(slots: int, tied: int, own: int) -> float:
    """P(at least one of ``own`` items lands in the first ``slots`` places of a uniformly
    shuffled group of ``tied``) = 1 - C(tied - own, slots) / C(tied, slots)."""
    if slots <= 0:
        return 0.0
    if slots >= tied:
        return 1.0
    miss = 1.0
    for t in range(own):   # all own items among the tied - slots places left out
        miss *= max(tied - slots - t, 0) / (tied - t)
    return 1.0 - miss
