"""SNLI-VE (``snli_ve_{train,dev,test}.jsonl``): Flickr30K image premise, text hypothesis.

Each line: ``{"Flikr30kID": "2248275918.jpg" (sic), "sentence2": hypothesis, "gold_label":
"entailment"|"neutral"|"contradiction", "pairID", "sentence1": the caption it came from,
...}``. Image id: the Flickr30K file name without extension, as the Karpathy captions use.
Output: ``tasks/ve/<split>.parquet`` with train / dev → val / test from the file name.
"""

from __future__ import annotations

from pathlib import Path

from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.readers import iter_jsonl, need
from vlp.datasets.importers.registry import Importer, ImportReport, register
from vlp.datasets.importers.task_import import (ALLOW_MISSING_IMAGES, IMAGES, NAME, TaskRows,
                                                write_tasks)
from vlp.datasets.storage.task_tables import VE_LABELS

FILE_SPLITS = {"train": "train", "dev": "val", "test": "test"}


def table_name(path: Path, name: str | None) -> str:
    if name:
        return name
    stem = path.name.split(".")[0].removeprefix("snli_ve_")
    if stem not in FILE_SPLITS:
        raise InputFormatError(path, "cannot tell the split from the file name (expected "
                                     "snli_ve_{train,dev,test}.jsonl): pass --name")
    return FILE_SPLITS[stem]


def run(inputs: list[Path], out: Path, *, overwrite: bool, name: str | None,
        images: str | None, allow_missing_images: bool) -> ImportReport:
    if name and len(inputs) > 1:
        raise ValueError("--name names one table: import one file at a time with it")
    tables: dict[str, TaskRows] = {}
    for path in inputs:
        rows = tables.setdefault(table_name(path, name), TaskRows("ve"))
        for rec, obj in iter_jsonl(path):
            pair = need(obj, "pairID", str, path, rec)
            rec = f"{rec} (pairID {pair})"
            key = "Flikr30kID" if "Flikr30kID" in obj else "Flickr30kID"  # the release's typo
            image = need(obj, key, str, path, rec)
            label = need(obj, "gold_label", str, path, rec)
            if label not in VE_LABELS:
                raise InputFormatError(path, f"gold_label {label!r}, expected one of "
                                             f"{VE_LABELS}", rec)
            rows.add(path, rec, id=pair, image_id=canonical_image_id(image),
                     hypothesis=need(obj, "sentence2", str, path, rec).strip(), label=label)
    return write_tasks("snli-ve", tables, inputs, out, overwrite=overwrite, images=images,
                       allow_missing_images=allow_missing_images,
                       options={"name": name, "images": images}, meta={"dataset": "snli-ve"})


register(Importer(
    name="snli-ve", kind="task",
    summary="SNLI-VE JSON lines → ve task table",
    inputs="snli_ve_train.jsonl, snli_ve_dev.jsonl and/or snli_ve_test.jsonl",
    description="One row per hypothesis: id (pairID), image_id (Flickr30K id), hypothesis "
                "(sentence2), label (gold_label). Written to OUT/tasks/ve/<split>.parquet "
                "(dev → val).",
    run=run, options=(NAME, IMAGES, ALLOW_MISSING_IMAGES)))
