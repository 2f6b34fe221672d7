"""VCR (``train.jsonl``, ``val.jsonl``): multiple-choice questions about movie stills.

Each line: ``{"annot_id": "val-0", "img_fn": "lsmdc_<movie>/<still>.jpg", "objects":
["person", "person", "car"], "question": [tokens], "answer_choices": [[tokens]] × 4,
"answer_label": 0..3, "rationale_choices": [[tokens]] × 4, "rationale_label": 0..3, ...}``.
Tokens are words or lists of indices into ``objects`` (``[0, 2]`` = "objects 0 and 2").

Decisions: a reference is rendered as the object's class name followed by its index
(``[0, 2]`` → ``person0 and car2``), which keeps who-is-who across question, answers and
rationales in plain text; the image id is the still's file name without extension (the
name feature extraction gives it). ``test.jsonl`` has no labels and cannot be a task table.
Output: ``tasks/vcr/<split>.parquet`` with the split from the file name.
"""

from __future__ import annotations

from pathlib import Path

from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.readers import iter_jsonl, need
from vlp.datasets.importers.registry import Importer, ImportReport, register
from vlp.datasets.importers.task_import import (ALLOW_MISSING_IMAGES, IMAGES, NAME, TaskRows,
                                                write_tasks)

NUM_CHOICES = 4


def render(tokens: list, objects: list[str], path: Path, record: str) -> str:
    words = []
    for t in tokens:
        if isinstance(t, str):
            words.append(t)
        elif isinstance(t, list) and t and all(isinstance(i, int) and not isinstance(i, bool)
                                               for i in t):
            bad = [i for i in t if not 0 <= i < len(objects)]
            if bad:
                raise InputFormatError(path, f"object reference {bad[0]} but the image has "
                                             f"{len(objects)} objects", record)
            words.append(" and ".join(f"{objects[i]}{i}" for i in t))
        else:
            raise InputFormatError(path, f"token {t!r} is neither a word nor a list of object "
                                         f"indices", record)
    text = " ".join(words).strip()
    if not text:
        raise InputFormatError(path, "empty text", record)
    return text


def _choices(obj: dict, key: str, objects, path: Path, rec: str) -> list[str]:
    choices = need(obj, key, list, path, rec)
    if len(choices) != NUM_CHOICES:
        raise InputFormatError(path, f"{len(choices)} {key}, expected {NUM_CHOICES}", rec)
    return [render(c if isinstance(c, list) else [c], objects, path, f"{rec}, {key}[{k}]")
            for k, c in enumerate(choices)]


def _label(obj: dict, key: str, path: Path, rec: str) -> int:
    if key not in obj:
        raise InputFormatError(path, f"missing field '{key}' (the VCR test split has no labels "
                                     f"and cannot be imported as a task table)", rec)
    label = need(obj, key, int, path, rec)
    if not 0 <= label < NUM_CHOICES:
        raise InputFormatError(path, f"{key} {label}, expected 0..{NUM_CHOICES - 1}", rec)
    return label


def run(inputs: list[Path], out: Path, *, overwrite: bool, name: str | None,
        images: str | None, allow_missing_images: bool) -> ImportReport:
    if name and len(inputs) > 1:
        raise ValueError("--name names one table: import one file at a time with it")
    tables: dict[str, TaskRows] = {}
    for path in inputs:
        split = name or path.name.split(".")[0]
        rows = tables.setdefault(split, TaskRows("vcr"))
        for rec, obj in iter_jsonl(path):
            annot = need(obj, "annot_id", str, path, rec)
            rec = f"{rec} ({annot})"
            objects = need(obj, "objects", list, path, rec, nonempty=False)
            if not all(isinstance(o, str) for o in objects):
                raise InputFormatError(path, "field 'objects' must be a list of class names",
                                       rec)
            question = render(need(obj, "question", list, path, rec), objects, path,
                              f"{rec}, question")
            rows.add(path, rec, id=annot,
                     image_id=canonical_image_id(need(obj, "img_fn", str, path, rec)),
                     question=question,
                     answers=_choices(obj, "answer_choices", objects, path, rec),
                     answer_label=_label(obj, "answer_label", path, rec),
                     rationales=_choices(obj, "rationale_choices", objects, path, rec),
                     rationale_label=_label(obj, "rationale_label", path, rec))
    return write_tasks("vcr", tables, inputs, out, overwrite=overwrite, images=images,
                       allow_missing_images=allow_missing_images,
                       options={"name": name, "images": images}, meta={"dataset": "vcr"})


register(Importer(
    name="vcr", kind="task",
    summary="VCR JSON lines (train/val.jsonl) → vcr task table",
    inputs="train.jsonl and/or val.jsonl",
    description="One row per question: id (annot_id), image_id (still file name), question, "
                "4 answers, answer_label, 4 rationales, rationale_label; object references "
                "[i] are written as <class><i> (e.g. person0). Written to "
                "OUT/tasks/vcr/<split>.parquet.",
    run=run, options=(NAME, IMAGES, ALLOW_MISSING_IMAGES)))
