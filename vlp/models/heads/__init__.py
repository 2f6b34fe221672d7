"""Downstream heads and losses (UNITER §4 / Appendix; ImageBERT's retrieval losses), a
registry by name, and :class:`DownstreamModel` (backbone + one head).

    head = build_head("vqa-classifier", name="vqa", hidden=768, num_answers=3129)
    model = DownstreamModel(pretrained.backbone, head)
"""

from __future__ import annotations

from typing import Callable

from vlp.models.heads.head import DownstreamHead
from vlp.models.heads.choice import ChoicePairClassifier
from vlp.models.heads.classifier import ClassClassifier, SoftScoreClassifier
from vlp.models.heads.downstream_model import DownstreamModel
from vlp.models.heads.nlvr2 import NLVR2_HEADS, PairBiAttnHead, PairHead, TripletHead
from vlp.models.heads.refexp import RegionScorer
from vlp.models.heads.retrieval import MatchScorer
from vlp.models.heads.retrieval_losses import RETRIEVAL_LOSSES
from vlp.models.heads.token_types import extend_for, extra_type_rows, layout_types

HEADS: dict[str, Callable[..., DownstreamHead]] = {
    "soft-score-classifier": SoftScoreClassifier,   # VQA
    "class-classifier": ClassClassifier,            # SNLI-VE
    "nlvr2-triplet": TripletHead,
    "nlvr2-pair": PairHead,
    "nlvr2-pair-biattn": PairBiAttnHead,
    "match-scorer": MatchScorer,                    # retrieval
    "region-scorer": RegionScorer,                  # RE comprehension
    "choice-pair-classifier": ChoicePairClassifier,  # VCR: right/wrong per choice
}


def build_head(kind: str, **kwargs) -> DownstreamHead:
    """A new head, initialised like BERT's (N(0, 0.02), LayerNorm (1, 0), zero bias) except
    what it copies from a pretrained head (retrieval's ITM init)."""
    from vlp.models.checkpoints.random_init import init_bert_weights

    try:
        cls = HEADS[kind]
    except KeyError:
        raise KeyError(f"unknown downstream head {kind!r}; known: {', '.join(HEADS)}") from None
    itm = kwargs.get("itm_head")
    head = cls(**kwargs)
    if itm is None or not getattr(head, "from_itm", False):
        init_bert_weights(head)
    else:   # keep the copied ITM weights, initialise the rest
        saved = {k: v.clone() for k, v in head.out.state_dict().items()}
        init_bert_weights(head)
        head.out.load_state_dict(saved)
    return head


__all__ = ["HEADS", "build_head", "DownstreamHead", "DownstreamModel", "SoftScoreClassifier",
           "ClassClassifier", "TripletHead", "PairHead", "PairBiAttnHead", "MatchScorer",
           "RegionScorer", "ChoicePairClassifier", "NLVR2_HEADS", "RETRIEVAL_LOSSES",
           "extend_for", "extra_type_rows", "layout_types"]
