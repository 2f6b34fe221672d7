"""RefCOCO / RefCOCO+ / RefCOCOg: the refer toolkit's ``refs(<splitBy>).p`` + ``instances.json``.

``refs(unc).p`` (a Python 2 pickle, read with ``restricted_pickle``): a list of ``{"ref_id",
"ann_id", "image_id", "split": train|val|testA|testB|test, "sentences": [{"sent_id", "raw",
"sent", "tokens"}], "category_id", "file_name", ...}``. ``instances.json`` (COCO style):
``annotations[{"id", "image_id", "bbox": [x, y, w, h], ...}]``.

One row per expression: ref_id ``<ref_id>_<sent_id>``, the COCO image id, the raw expression,
the referred annotation's box (x1, y1, x2, y2 pixels), every annotated box of the image in
``instances.json`` order (the ground-truth-box setting), and the referred box's index among
them. RefCOCO, RefCOCO+ and RefCOCOg share COCO images and split names, so tables are named
``tasks/refexp/<dataset>_<split>.parquet`` (e.g. ``refcoco+_testA``).
"""

from __future__ import annotations

import math
from pathlib import Path

from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.readers import load_json, need, need_list
from vlp.datasets.importers.registry import Importer, ImportReport, Option, register
from vlp.datasets.importers.restricted_pickle import load_plain_pickle
from vlp.datasets.importers.task_import import ALLOW_MISSING_IMAGES, IMAGES, TaskRows, write_tasks

DATASETS = ("refcoco", "refcoco+", "refcocog")


def _annotations(path: Path) -> tuple[dict[int, tuple[str, list[float]]], dict[str, list[int]]]:
    """ann id → (image id, xyxy box) and image id → ann ids in file order."""
    doc = load_json(path)
    boxes: dict[int, tuple[str, list[float]]] = {}
    per_image: dict[str, list[int]] = {}
    for i, a in enumerate(need_list(doc, "annotations", path)):
        rec = f"annotations[{i}]"
        ann_id = need(a, "id", int, path, rec)
        rec = f"annotations[{i}] (id {ann_id})"
        image_id = canonical_image_id(need(a, "image_id", int, path, rec))
        bbox = need(a, "bbox", list, path, rec)
        if (len(bbox) != 4 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                      and math.isfinite(v) for v in bbox)
                or bbox[2] < 0 or bbox[3] < 0):
            raise InputFormatError(path, f"bbox {bbox!r}, expected [x, y, width, height] with "
                                         f"finite numbers and non-negative size", rec)
        x, y, w, h = map(float, bbox)
        boxes[ann_id] = (image_id, [x, y, x + w, y + h])
        per_image.setdefault(image_id, []).append(ann_id)
    return boxes, per_image


def _dataset_name(refs_path: Path, dataset: str | None) -> str:
    if dataset:
        return dataset
    guess = refs_path.resolve().parent.name.lower()
    if guess not in DATASETS:
        raise ValueError(f"cannot tell the dataset from the folder {guess!r} of {refs_path}: "
                         f"pass --dataset {{{','.join(DATASETS)}}}")
    return guess


def run(inputs: list[Path], out: Path, *, overwrite: bool, dataset: str | None,
        images: str | None, allow_missing_images: bool) -> ImportReport:
    refs_files = [p for p in inputs if p.suffix.lower() in (".p", ".pkl", ".pickle")]
    json_files = [p for p in inputs if p.suffix.lower() == ".json"]
    if len(refs_files) != 1 or len(json_files) != 1:
        raise ValueError("refcoco needs the refs pickle (refs(unc).p / refs(umd).p / "
                         "refs(google).p) and instances.json")
    refs_path, inst_path = refs_files[0], json_files[0]
    dataset = _dataset_name(refs_path, dataset)
    boxes, per_image = _annotations(inst_path)
    refs = load_plain_pickle(refs_path)
    if not isinstance(refs, list):
        raise InputFormatError(refs_path, f"holds a {type(refs).__name__}, expected a list of "
                                          f"refs")
    tables: dict[str, TaskRows] = {}
    for i, ref in enumerate(refs):
        rec = f"refs[{i}]"
        ref_id = need(ref, "ref_id", int, refs_path, rec)
        rec = f"refs[{i}] (ref_id {ref_id})"
        ann_id = need(ref, "ann_id", int, refs_path, rec)
        image_id = canonical_image_id(need(ref, "image_id", int, refs_path, rec))
        split = need(ref, "split", str, refs_path, rec)
        if ann_id not in boxes:
            raise InputFormatError(refs_path, f"ann_id {ann_id} is not in {inst_path.name}", rec)
        if boxes[ann_id][0] != image_id:
            raise InputFormatError(refs_path, f"image {image_id}, but ann_id {ann_id} belongs "
                                              f"to image {boxes[ann_id][0]} in "
                                              f"{inst_path.name}", rec)
        anns = per_image[image_id]
        gt = [v for a in anns for v in boxes[a][1]]
        rows = tables.setdefault(f"{dataset}_{split}", TaskRows("refexp"))
        for j, sent in enumerate(need(ref, "sentences", list, refs_path, rec)):
            srec = f"{rec}.sentences[{j}]"
            sent_id = need(sent, "sent_id", int, refs_path, srec)
            key = "raw" if isinstance(sent, dict) and str(sent.get("raw") or "").strip() \
                else "sent"
            text = " ".join(need(sent, key, str, refs_path, srec).split())
            rows.add(refs_path, srec, ref_id=f"{ref_id}_{sent_id}", image_id=image_id,
                     expression=text, target_box=boxes[ann_id][1], gt_boxes=gt,
                     target_gt_index=anns.index(ann_id))
    return write_tasks("refcoco", tables, inputs, out, overwrite=overwrite, images=images,
                       allow_missing_images=allow_missing_images,
                       options={"dataset": dataset, "images": images},
                       meta={"dataset": dataset})


register(Importer(
    name="refcoco", kind="task",
    summary="RefCOCO/RefCOCO+/RefCOCOg refs pickle + instances.json → refexp task tables",
    inputs="refs(unc).p (or refs(umd).p, refs(google).p) and instances.json, any order",
    description="The refs pickle is read with a restricted unpickler (plain containers only; a "
                "pickle naming any class or function is refused before anything runs). One "
                "row per expression; target and ground-truth boxes come from instances.json. "
                "Written to OUT/tasks/refexp/<dataset>_<split>.parquet for every split in the "
                "file (refcoco+_train, refcoco+_val, refcoco+_testA, refcoco+_testB, ...).",
    run=run, min_inputs=2, max_inputs=2,
    options=(Option("--dataset", "refcoco, refcoco+ or refcocog (default: the refs file's "
                                 "folder name, as the refer toolkit lays them out)",
                    choices=DATASETS),
             IMAGES, ALLOW_MISSING_IMAGES)))
