"""Each family's own downstream protocol: the head or loss its paper finetunes a benchmark
with, by the family's kind, as data.

    options_for("retrieval", "imagebert-tiny")   # {"loss": "binary"}
    protocol_label({"retrieval": "binary", "nlvr2": "pair-biattn"})   # "retrieval:binary ..."

A finetune (``FinetuneConfig.settings_for``) starts a benchmark's options from its family's
entry here (``protocol: family``, the default) or from UNITER's for every family
(``protocol: uniter``, one protocol for a comparison across families); options set in
``settings.<benchmark>.options`` are taken as given. A benchmark the family's paper does not
report keeps UNITER's protocol (the options' own defaults), and says so (``source``).

The papers (../shared/papers/):
- retrieval: UNITER §4.1 — "a ranking problem … maximize the margin between them through
  triplet loss" on one positive and two sampled negatives (vlp's ``margin``);
  ImageBERT §4.4 and §5.3 (Table 4 part 4) — "Binary only" is its best (Flickr30k IR R@1
  73.1 vs 70.6 with a triplet loss, 71.9 with the three together); SOHO §4.2.1 — "a binary
  classification problem" on aligned and unaligned pairs built inside the mini-batch (all
  the other t−1 captions of the batch are each image's unaligned captions). VL-BERT reports
  no retrieval.
- NLVR2: UNITER §4.3 and Appendix A.2 (Table 6) — pair-biattn is its best; SOHO §4.2.3 — "input two
  pairs of image-text to Transformer and get two embedding vectors from [CLS] tokens. Then
  we learn a classifier on the concatenation", the pair set-up. VL-BERT and ImageBERT
  report no NLVR2.
- RefCOCO+: UNITER §4.1 — a softmax over the regions; VL-BERT §4.2.3 — "For each RoI, a
  binary classification loss is applied". ImageBERT reports none; SOHO reads pixels and has
  no regions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PROTOCOLS = ("family", "uniter")      # FinetuneConfig.protocol

# family kind → benchmark → {option: the paper's value}; absent = the paper reports none
# (UNITER's protocol, the options' defaults, applies)
FAMILY_PROTOCOLS: dict[str, dict[str, dict[str, str]]] = {
    "uniter": {"retrieval": {"loss": "margin"}, "nlvr2": {"variant": "pair-biattn"},
               "refcoco+": {"head": "softmax"}, "refcoco+-gt": {"head": "softmax"}},
    "imagebert": {"retrieval": {"loss": "binary"}},                 # §5.3, Table 4
    "soho": {"retrieval": {"loss": "in-batch-binary"},              # §4.2.1
             "nlvr2": {"variant": "pair"}},                         # §4.2.3
    "vlbert": {"refcoco+": {"head": "per-roi-binary"},              # §4.2.3
               "refcoco+-gt": {"head": "per-roi-binary"}},
}
CITES = {("uniter", "retrieval"): "UNITER §4.1", ("uniter", "nlvr2"): "UNITER §4.3",
         ("uniter", "refcoco+"): "UNITER §4.1", ("uniter", "refcoco+-gt"): "UNITER §4.1",
         ("imagebert", "retrieval"): "ImageBERT §5.3",
         ("soho", "retrieval"): "SOHO §4.2.1", ("soho", "nlvr2"): "SOHO §4.2.3",
         ("vlbert", "refcoco+"): "VL-BERT §4.2.3", ("vlbert", "refcoco+-gt"): "VL-BERT §4.2.3"}


def family_kind(family: str) -> str:
    """The family's kind; "" for an unknown family (``model.family``'s own error names it)."""
    from vlp.models import FAMILIES

    return FAMILIES[family].visual.kind if family in FAMILIES else ""


def options_for(benchmark: str, family: str, protocol: str = "family") -> dict[str, str]:
    """The protocol options a finetune of ``benchmark`` on ``family`` starts from."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown downstream protocol {protocol!r}; known: {PROTOCOLS}")
    kind = family_kind(family) if protocol == "family" else "uniter"
    return dict(FAMILY_PROTOCOLS.get(kind, {}).get(benchmark, {}))


def source(benchmark: str, family: str, protocol: str, options: Mapping[str, Any]) -> str:
    """Where a finetune's protocol came from, in words: its family's paper, UNITER's (the
    paper reports none, or ``protocol: uniter``), or set in the config."""
    from vlp.benchmarks.registry import get_benchmark

    key = get_benchmark(benchmark).protocol_option
    if key is None:
        return ""
    if key in options:
        return "set"
    kind = family_kind(family)
    if protocol == "family" and benchmark in FAMILY_PROTOCOLS.get(kind, {}):
        return CITES.get((kind, benchmark), f"{kind}'s paper")
    if protocol == "uniter":
        return "UNITER's (protocol: uniter)"
    return f"UNITER's ({kind}'s paper reports none)"


def protocol_label(protocols: Mapping[str, str]) -> str:
    """``benchmark:protocol`` for each benchmark that has a choice, in name order."""
    return " ".join(f"{b}:{p}" for b, p in sorted(protocols.items()) if p)
