"""NLVR2 (``train.json``, ``dev.json``, ``test1.json``: JSON lines despite the extension).

Each line: ``{"identifier": "dev-850-0-0", "sentence": ..., "label": "True"|"False",
"left_url", "right_url", ...}``. The two images of ``<split>-<set>-<pair>-<sentence>`` are
``<split>-<set>-<pair>-img0`` (left) and ``-img1`` (right), the names the image files and
their feature TSVs use. Output: ``tasks/nlvr2/<split>.parquet`` with train → train,
dev → val, test1 → test (from the file name; ``--name`` otherwise).
"""

from __future__ import annotations

from pathlib import Path

from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.readers import iter_jsonl, need
from vlp.datasets.importers.registry import Importer, ImportReport, register
from vlp.datasets.importers.task_import import (ALLOW_MISSING_IMAGES, IMAGES, NAME, TaskRows,
                                                write_tasks)

FILE_SPLITS = {"train": "train", "dev": "val", "test1": "test", "test": "test"}
LABELS = {"true": True, "false": False}


def pair_images(identifier: str, path: Path, record: str) -> tuple[str, str]:
    stem, sep, last = identifier.rpartition("-")
    if not sep or not last.isdigit() or stem.count("-") < 2:
        raise InputFormatError(path, f"identifier {identifier!r} is not <split>-<set>-<pair>-"
                                     f"<sentence>", record)
    return f"{stem}-img0", f"{stem}-img1"


def table_name(path: Path, name: str | None) -> str:
    if name:
        return name
    stem = path.name.split(".")[0]
    if stem not in FILE_SPLITS:
        raise InputFormatError(path, f"cannot tell the split from the file name (expected one "
                                     f"of {sorted(FILE_SPLITS)}.json): pass --name")
    return FILE_SPLITS[stem]


def run(inputs: list[Path], out: Path, *, overwrite: bool, name: str | None,
        images: str | None, allow_missing_images: bool) -> ImportReport:
    if name and len(inputs) > 1:
        raise ValueError("--name names one table: import one file at a time with it")
    tables: dict[str, TaskRows] = {}
    for path in inputs:
        rows = tables.setdefault(table_name(path, name), TaskRows("nlvr2"))
        for rec, obj in iter_jsonl(path):
            ident = need(obj, "identifier", str, path, rec)
            rec = f"{rec} ({ident})"
            label = need(obj, "label", (str, bool), path, rec)
            if isinstance(label, str):
                if label.strip().lower() not in LABELS:
                    raise InputFormatError(path, f"label {label!r}, expected True or False", rec)
                label = LABELS[label.strip().lower()]
            left, right = pair_images(ident, path, rec)
            rows.add(path, rec, id=ident, image_id_left=left, image_id_right=right,
                     statement=need(obj, "sentence", str, path, rec).strip(), label=label)
    return write_tasks("nlvr2", tables, inputs, out, overwrite=overwrite, images=images,
                       allow_missing_images=allow_missing_images,
                       options={"name": name, "images": images}, meta={"dataset": "nlvr2"})


register(Importer(
    name="nlvr2", kind="task",
    summary="NLVR2 JSON lines (train/dev/test1.json) → nlvr2 task table",
    inputs="train.json, dev.json and/or test1.json",
    description="One row per statement: id, left/right image ids (<identifier stem>-img0/1), "
                "statement, label. Written to OUT/tasks/nlvr2/<split>.parquet (dev → val, "
                "test1 → test).",
    run=run, options=(NAME, IMAGES, ALLOW_MISSING_IMAGES)))
