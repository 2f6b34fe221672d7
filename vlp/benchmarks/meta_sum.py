"""UNITER Table 3's Meta-Sum: the one list of its parts, and the sum.

Every other view of the parts derives from ``PARTS``: which benchmark reports a part under
which metric key (``Benchmark.meta_parts``), the benchmarks a finetune runs by default, the
MLflow key a sweep logs a part under, and the leaderboard's columns and bar colours. This
module imports nothing heavy, so the leaderboard reads it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class MetaPart:
    name: str           # the part as users and reports spell it ("refcoco+")
    benchmark: str      # the registered benchmark whose evaluation scores it
    metric: str         # the key of that benchmark's metrics that is the part
    label: str          # the leaderboard's column (Table 3's heading)
    colour: str         # its segment in the leaderboard's stacked bar

    @property
    def key(self) -> str:
        """The part as an MLflow metric key ('+' is not allowed there: refcoco_plus)."""
        return metric_key(self.name)


PARTS = (
    MetaPart("vqa", "vqa", "vqa_score", "VQA", "#4C72B0"),
    MetaPart("ir", "retrieval", "ir_mean", "IR", "#55A868"),
    MetaPart("tr", "retrieval", "tr_mean", "TR", "#8172B2"),
    MetaPart("nlvr2", "nlvr2", "nlvr2_acc", "NLVR2", "#C44E52"),
    MetaPart("refcoco+", "refcoco+", "refcocoplus_acc", "RefCOCO+", "#CCB974"),
)
PART_NAMES = tuple(p.name for p in PARTS)
# the benchmarks that together score every part, in the order of their first part
BENCHMARKS = tuple(dict.fromkeys(p.benchmark for p in PARTS))


def metric_key(part: str) -> str:
    """Meta-Sum part → a key MLflow accepts ('+' is not allowed in metric names)."""
    return part.replace("+", "_plus")


def parts_of(benchmark: str) -> tuple[MetaPart, ...]:
    """The parts ``benchmark`` scores (none for a benchmark outside Meta-Sum)."""
    return tuple(p for p in PARTS if p.benchmark == benchmark)


def complete(scores: Mapping[str, float]) -> bool:
    """Whether ``scores`` holds every part (Meta-Sum is defined)."""
    return all(p in scores for p in PART_NAMES)


def meta_sum(scores: Mapping[str, float]) -> float:
    """UNITER Table 3's Meta-Sum: VQA score + IR mean(R@1,5,10) + TR mean(R@1,5,10) +
    NLVR2 accuracy + RefCOCO+ accuracy on detected boxes (each in percent)."""
    missing = [k for k in PART_NAMES if k not in scores]
    if missing:
        raise KeyError(f"meta_sum needs scores for {list(PART_NAMES)}; missing {missing}")
    return float(sum(float(scores[k]) for k in PART_NAMES))
