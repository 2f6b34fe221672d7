"""MAttNet's detections for RefCOCO / RefCOCO+ / RefCOCOg: the boxes the papers' val^d,
testA^d and testB^d scores rank (UNITER footnote 9, VL-BERT §4.2.3).

The public file (``detections/<dataset>_<splitBy>/res101_coco_minus_refer_notime_dets.json``,
the file MAttNet's evaluation and the VL-BERT / VOLTA RefCOCO+ loaders read) is a JSON list
of detections, ``{"det_id", "h5_id", "image_id", "category_id", "category_name", "box": [x,
y, w, h], "score"}``; the refer toolkit's README writes the same list as ``{"dets": [...]}``,
read too. ``image_id`` and ``box`` are required; ``det_id``, ``score`` and ``category_id`` are
kept when present (the refer README: "might be missing, depending on what proposal/detection
technique we are using").

Writes ``OUT/detections/<dataset>_mattnet.parquet``: one row per image (canonical image id),
its detections in file order as ``boxes`` (x1, y1, x2, y2 pixels, flat), ``scores``,
``det_ids`` and ``category_ids`` (−1 / NaN where the file has none), and lists it in the
manifest as sidecar ``mattnet_dets.<dataset>``.

These are boxes, not features: their features come from vlp's extractor run on them,
``vlp data extract --boxes mattnet:<dataset> --source downstream --out OUT`` (the detector's
RoI pooling and head on these boxes, no RPN or NMS; docs/extract.md), which reads this
sidecar from the same world. Features extracted elsewhere on the same boxes (e.g.
bottom-up-attention's ``generate_tsv.py`` with the boxes given, imported with ``vlp data
import butd-tsv``) serve too. The RefCOCO+ benchmark with ``detections: mattnet`` then
checks, image by image, that the regions it scores are these boxes before it labels its
figure ``mattnet`` (``vlp.datasets.downstream.refexp``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlp.datasets.importers.data_folder import (import_record, require_world, staged_files,
                                                update_world)
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.readers import load_json, need
from vlp.datasets.importers.registry import Importer, ImportReport, Option, register

DATASETS = ("refcoco", "refcoco+", "refcocog")
SIDECAR = "mattnet_dets.{dataset}"           # manifest sidecar name per dataset
FILE = "detections/{dataset}_mattnet.parquet"
SCHEMA = pa.schema([("image_id", pa.string()), ("boxes", pa.list_(pa.float32())),
                    ("scores", pa.list_(pa.float32())), ("det_ids", pa.list_(pa.int64())),
                    ("category_ids", pa.list_(pa.int32()))])


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _optional(det: dict, key: str, kind: type, path: Path, rec: str):
    if key not in det or det[key] is None:
        return None
    ok = _number(det[key]) and (kind is float or float(det[key]).is_integer())
    if not ok:
        raise InputFormatError(path, f"field '{key}' is {det[key]!r}, expected a finite "
                                     f"{'number' if kind is float else 'integer'}", rec)
    return kind(det[key])


def read_detections(path: Path) -> dict[str, dict[str, list]]:
    """image id → {"boxes": [[x1, y1, x2, y2]...], "scores", "det_ids", "category_ids"}, in
    file order. Every bad entry is one line naming the file, the entry and the key."""
    doc = load_json(path, (list, dict))
    if isinstance(doc, dict):
        doc = need(doc, "dets", list, path, "top level")
    if not isinstance(doc, list):
        raise InputFormatError(path, f"holds a {type(doc).__name__}, expected a list of "
                                     f"detections (or {{\"dets\": [...]}})")
    if not doc:
        raise InputFormatError(path, "holds no detections")
    images: dict[str, dict[str, list]] = {}
    seen: dict[int, int] = {}
    for i, det in enumerate(doc):
        rec = f"dets[{i}]"
        # COCO's integer id (MAttNet's), or a name the other importers' ids spell
        image_id = canonical_image_id(need(det, "image_id", (int, str), path, rec))
        det_id = _optional(det, "det_id", int, path, rec)
        if det_id is not None:
            rec = f"dets[{i}] (det_id {det_id})"
            if det_id in seen:
                raise InputFormatError(path, f"det_id {det_id} again (first at dets"
                                             f"[{seen[det_id]}])", rec)
            seen[det_id] = i
        box = need(det, "box", list, path, rec)
        if len(box) != 4 or not all(map(_number, box)) or box[2] < 0 or box[3] < 0:
            raise InputFormatError(path, f"field 'box' is {box!r}, expected [x, y, width, "
                                         f"height] with finite numbers and non-negative size",
                                   rec)
        score = _optional(det, "score", float, path, rec)
        category = _optional(det, "category_id", int, path, rec)
        x, y, w, h = map(float, box)
        out = images.setdefault(image_id, {"boxes": [], "scores": [], "det_ids": [],
                                           "category_ids": []})
        out["boxes"].append([x, y, x + w, y + h])
        out["scores"].append(math.nan if score is None else score)
        out["det_ids"].append(-1 if det_id is None else det_id)
        out["category_ids"].append(-1 if category is None else category)
    return images


def detections_table(images: dict[str, dict[str, list]]) -> pa.Table:
    ids = list(images)
    return pa.table({
        "image_id": ids,
        "boxes": [np.asarray(images[i]["boxes"], np.float32).ravel().tolist() for i in ids],
        "scores": [images[i]["scores"] for i in ids],
        "det_ids": [images[i]["det_ids"] for i in ids],
        "category_ids": [images[i]["category_ids"] for i in ids]}, schema=SCHEMA)


def _dataset_name(path: Path, dataset: str | None) -> str:
    if dataset:
        return dataset
    folder = path.resolve().parent.name.lower()      # refcoco+_unc, refcocog_umd, ...
    guess = folder.rsplit("_", 1)[0] if "_" in folder else folder
    if guess not in DATASETS:
        raise ValueError(f"cannot tell the dataset from the folder {folder!r} of {path}: "
                         f"pass --dataset {{{','.join(DATASETS)}}}")
    return guess


def run(inputs: list[Path], out: Path, *, overwrite: bool, dataset: str | None) -> ImportReport:
    path = Path(inputs[0])
    dataset = _dataset_name(path, dataset)
    require_world(out)      # before the file is read: a wrong OUT fails at once
    images = read_detections(path)
    table = detections_table(images)
    rel = FILE.format(dataset=dataset)
    target = Path(out) / rel
    with staged_files([target], overwrite) as (tmp,):
        pq.write_table(table, tmp)
    counts = {"images": table.num_rows, "detections": sum(len(v["scores"])
                                                          for v in images.values())}

    def change(world) -> None:
        world.sidecars[SIDECAR.format(dataset=dataset)] = rel
    update_world(out, change, log=import_record("mattnet-dets", inputs, counts,
                                                {"dataset": dataset}, [rel]))
    return ImportReport("mattnet-dets", [target], counts,
                        [f"boxes only: extract their features with vlp data extract --boxes "
                         f"mattnet:{dataset} --source downstream --out {out}; the RefCOCO+ "
                         f"benchmark's detections: mattnet checks per image that the regions "
                         f"are these boxes"])


register(Importer(
    name="mattnet-dets", kind="task",
    summary="MAttNet's RefCOCO(+/g) detections json → the detected boxes of val^d/testA^d/"
            "testB^d",
    inputs="res101_coco_minus_refer_notime_dets.json (a list of {image_id, box: [x, y, w, "
           "h], score, det_id, category_id}, or {\"dets\": [...]})",
    description="The detections the papers' RefCOCO+ detected-box scores rank (UNITER "
                "footnote 9, VL-BERT §4.2.3). Written to OUT/detections/<dataset>_mattnet."
                "parquet, one row per image, boxes as x1, y1, x2, y2 pixels. Boxes only: the "
                "features of these boxes must be the world's downstream image source (vlp "
                "data extract --boxes mattnet:<dataset> --source downstream); finetune with "
                "settings.refcoco+.options.detections=mattnet, which checks that per image.",
    run=run, min_inputs=1, max_inputs=1,
    options=(Option("--dataset", "refcoco, refcoco+ or refcocog (default: the file's folder "
                                 "name, refcoco+_unc as MAttNet lays them out)",
                    choices=DATASETS),)))
