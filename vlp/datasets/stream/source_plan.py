"""``DataPlan`` and ``SourcePlan``: what ``data_plan.plan_data`` derives, as plain data.

Apart from ``data_plan`` so that a process which only uses a plan (a Ray Data map worker
running ``image_rows``, which unpickles one) does not import the task registry, and torch
with it: ~1 CPU second in every such process.
"""

from __future__ import annotations

from dataclasses import dataclass

from vlp.datasets.stream.data_config import DataConfig
from vlp.datasets.stream.location import LOCATION_FEATURES


@dataclass(frozen=True)
class SourcePlan:
    name: str
    files: tuple[str, ...]
    weight: float
    examples: int       # pairs (regions) or captioned images (pixels) in the split; counted
                        # only to turn weights into rates (0 with a single weighted source)
    rate: float         # expected copies of each example per epoch


@dataclass(frozen=True)
class DataPlan:
    config: DataConfig
    tasks: tuple[str, ...]
    sources: tuple[SourcePlan, ...]
    feature_dim: int
    num_classes: int | None
    tokenizer_path: str
    read_columns: tuple[str, ...]
    needs_soft_labels: bool
    object_words: tuple[str, ...] = ()   # mlm-obj's targets (empty when no task needs them)

    @property
    def loc_dim(self) -> int:
        return LOCATION_FEATURES[self.config.location].width

    @property
    def files(self) -> list[str]:
        """The shards to read (a source of weight 0 is checked but not read)."""
        return [f for s in self.sources if s.rate > 0 for f in s.files]

    @property
    def rates(self) -> tuple[float, ...]:
        return tuple(s.rate for s in self.sources)

    def source_of_file(self) -> dict[str, int]:
        return {f: i for i, s in enumerate(self.sources) for f in s.files}

    def summary(self) -> str:
        lines = [f"{s.name}: {len(s.files)} shards, "
                 + (f"{s.examples} examples, " if s.examples else "")
                 + f"weight {s.weight:g} → rate {s.rate:.3f}" for s in self.sources]
        return "; ".join(lines)


__all__ = ["DataPlan", "SourcePlan"]
