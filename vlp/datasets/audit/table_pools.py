"""Task tables as the audit sees them: which image pool each points at, and in which split role.

One pool per table: the ``image_source`` its importer recorded in the table's metadata (VQA
and RefCOCO+ point at ``coco``, which also feeds pretraining; SNLI-VE at ``flickr30k``), or,
for a table that records none (the synthetic world's), the ``downstream``-domain source(s).

The *context* of a table decides which other tables it must not share images with:
- a table with ``image_source`` belongs to its benchmark (``audit_splits.benchmark_of``); the
  corpus it points at has its own split scheme (Karpathy's, for COCO and Flickr30K), which
  other benchmarks on the same images do not follow: one COCO image is in RefCOCO+'s testA and
  in VQA's train, and that is not a leak;
- a table without one shares its pool's split scheme (``pool:<source>``), as in the synthetic
  world where every task's ``test`` table names the pool's ``test`` images: a ``test`` row
  naming a ``train`` image of the pool is a leak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from vlp.datasets.audit.keys import SourceRows
from vlp.datasets.audit.splits import benchmark_of, split_role
from vlp.datasets.storage.task_tables import read_task_table

TASK_IMAGE_COLUMNS = {"nlvr2": ("image_id_left", "image_id_right")}
TEXT_COLUMNS = {"vqa": "question", "retrieval": "caption", "nlvr2": "statement",
                "ve": "hypothesis", "refexp": "expression", "vcr": "question"}


def pool_context(source: str) -> str:
    return f"pool:{source}"


@dataclass
class TableRefs:
    task: str
    split: str
    rel: str
    role: str | None                   # train | eval | None (the name does not say)
    image_source: str | None           # as recorded in the table's metadata
    num_rows: int
    texts: list[str]
    refs: list[tuple[str, int]] = field(default_factory=list)   # (pool, row), distinct
    missing: list[str] = field(default_factory=list)
    ambiguous: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"task {self.task}:{self.split}"

    def context(self, pool: str) -> str:
        return benchmark_of(self.task, self.split) if self.image_source else pool_context(pool)


def resolve_table(root: Path, task: str, split: str, rel: str,
                  pools: Mapping[str, SourceRows], problems: list[str],
                  roles: Mapping[str, str] | None = None) -> TableRefs:
    table, info = read_task_table(root / rel, task)
    source = (info.extra or {}).get("image_source")
    cols = TASK_IMAGE_COLUMNS.get(task, ("image_id",))
    ids = list(dict.fromkeys(i for c in cols for i in table.column(c).to_pylist()))
    out = TableRefs(task, split, rel, split_role(split, task, roles), source, table.num_rows,
                    table.column(TEXT_COLUMNS[task]).to_pylist())
    if out.role is None:
        problems.append(f"{rel}: cannot tell from the split name {split!r} whether it is "
                        f"trained or evaluated on; say so with --split-role {task}/{split}="
                        f"train|eval")
    if source is not None:
        if source not in pools:
            problems.append(f"{rel}: its metadata names image_source={source!r}, but the "
                            f"folder has no such source (it has {sorted(pools)})")
            return out
        candidates = [pools[source]]
    else:
        candidates = [p for p in pools.values() if p.domain == "downstream"]
        if not candidates:
            problems.append(f"{rel}: records no image_source and the folder has no "
                            f"downstream-domain source to look its images up in")
            return out
    for iid in ids:
        found = [(p.name, p.row_of[iid]) for p in candidates if iid in p.row_of]
        if not found:
            out.missing.append(iid)
            continue
        if len(found) > 1:
            out.ambiguous.append(iid)
        out.refs.append(found[0])
    if out.missing:
        pools_named = source or "/".join(p.name for p in candidates)
        problems.append(f"{rel}: {len(out.missing)} image id(s) not in the image shards of "
                        f"{pools_named}, e.g. {out.missing[:3]}")
    if out.ambiguous:
        problems.append(f"{rel}: {len(out.ambiguous)} image id(s) are in several downstream "
                        f"sources ({[p.name for p in candidates]}), e.g. {out.ambiguous[:3]}; "
                        f"re-import the table with --images to record its image_source")
    return out
