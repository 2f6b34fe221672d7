"""Writers of tiny files in the *public* formats the importers read (no downloads).

Each writer produces bytes laid out the way the public release is (column order, dtypes,
JSON keys), so a test that imports them checks the importer against the format, not against
vlp's own output. Shared by the tests/test_importers_*.py files; holds no tests itself.
"""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path

import numpy as np

from vlp.datasets.importers import run_import

DIM = 16  # region feature width in the fixtures (2048 in the real dumps)


def b64(arr: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode()


def make_images(ids, *, boxes: int = 3, dim: int = DIM, size=(64, 48), seed: int = 0):
    """Detector output for each id: pixel boxes inside a W×H image, float32 features."""
    rng = np.random.default_rng(seed)
    out = []
    w, h = size
    for k, image_id in enumerate(ids):
        x1 = rng.uniform(0, w / 2, boxes)
        y1 = rng.uniform(0, h / 2, boxes)
        bx = np.stack([x1, y1, x1 + rng.uniform(1, w / 2, boxes),
                       y1 + rng.uniform(1, h / 2, boxes)], 1).astype(np.float32)
        out.append({"id": image_id, "w": w, "h": h, "boxes": bx,
                    "features": rng.normal(size=(boxes, dim)).astype(np.float32),
                    "conf": rng.uniform(0.2, 1.0, boxes).astype(np.float32),
                    "objects": rng.integers(0, 1600, boxes).astype(np.int64),
                    "attrs": rng.integers(0, 400, boxes).astype(np.int64)})
    return out


def write_butd_tsv(path: Path, images) -> Path:
    """Original bottom-up-attention layout: image_id, image_w, image_h, num_boxes, boxes,
    features."""
    with open(path, "w") as f:
        for im in images:
            f.write("\t".join([str(im["id"]), str(im["w"]), str(im["h"]),
                               str(len(im["boxes"])), b64(im["boxes"]),
                               b64(im["features"])]) + "\n")
    return path


def write_lxmert_tsv(path: Path, images) -> Path:
    """LXMERT layout: img_id, img_h, img_w, objects_id, objects_conf, attrs_id, attrs_conf,
    num_boxes, boxes, features (ids int64, confidences float32)."""
    with open(path, "w") as f:
        for im in images:
            n = len(im["boxes"])
            f.write("\t".join([str(im["id"]), str(im["h"]), str(im["w"]), b64(im["objects"]),
                               b64(im["conf"]), b64(im["attrs"]), b64(im["conf"] / 2),
                               str(n), b64(im["boxes"]), b64(im["features"])]) + "\n")
    return path


def write_uniter_npz(folder: Path, images, num_classes: int = 5) -> Path:
    """One <name>.npz per image: features, norm_bb (N×6), conf, soft_labels."""
    folder.mkdir(parents=True, exist_ok=True)
    for im in images:
        w, h = im["w"], im["h"]
        b = im["boxes"] / np.array([w, h, w, h], np.float32)
        norm = np.concatenate([b, b[:, 2:3] - b[:, 0:1], b[:, 3:4] - b[:, 1:2]], 1)
        soft = np.random.default_rng(1).dirichlet(np.ones(num_classes), len(b))
        np.savez(folder / f"{im['id']}.npz", features=im["features"],
                 norm_bb=norm.astype(np.float32), conf=im["conf"],
                 soft_labels=soft.astype(np.float32))
    return folder


def write_json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def karpathy_doc(dataset: str, images) -> dict:
    """images: (filename, cocoid or None, split, [sentences])."""
    doc, sentid = {"dataset": dataset, "images": []}, 0
    for imgid, (filename, cocoid, split, sents) in enumerate(images):
        entry = {"filename": filename, "imgid": imgid, "split": split, "sentids": [],
                 "sentences": []}
        if cocoid is not None:
            entry.update(cocoid=cocoid, filepath=filename.split("_")[1])
        for s in sents:
            entry["sentences"].append({"raw": s, "tokens": s.lower().split(), "imgid": imgid,
                                       "sentid": sentid})
            entry["sentids"].append(sentid)
            sentid += 1
        doc["images"].append(entry)
    return doc


def vqa_docs(items, subtype="val2014"):
    """items: (question_id, image_id, question, [10 answers])."""
    qs = {"data_subtype": subtype, "task_type": "Open-Ended", "data_type": "mscoco",
          "questions": [{"question_id": q, "image_id": i, "question": t}
                        for q, i, t, _ in items]}
    anns = {"data_subtype": subtype, "annotations": [
        {"question_id": q, "image_id": i, "question_type": "what", "answer_type": "other",
         "multiple_choice_answer": a[0],
         "answers": [{"answer": x, "answer_confidence": "yes", "answer_id": k + 1}
                     for k, x in enumerate(a)]} for q, i, _, a in items]}
    return qs, anns


def refcoco_files(folder: Path):
    """refcoco+/refs(unc).p (protocol-2 pickle of plain dicts) and instances.json."""
    folder.mkdir(parents=True, exist_ok=True)
    instances = {"images": [{"id": 9, "width": 64, "height": 48, "file_name":
                             "COCO_train2014_000000000009.jpg"}],
                 "annotations": [
                     {"id": 100, "image_id": 9, "bbox": [1.0, 2.0, 10.0, 12.0],
                      "category_id": 1, "area": 120.0, "iscrowd": 0},
                     {"id": 101, "image_id": 9, "bbox": [20.0, 5.0, 30.0, 40.0],
                      "category_id": 1, "area": 1200.0, "iscrowd": 0}],
                 "categories": [{"id": 1, "name": "person"}]}
    refs = [{"ref_id": 0, "ann_id": 101, "image_id": 9, "split": "train", "category_id": 1,
             "file_name": "COCO_train2014_000000000009_101.jpg", "sent_ids": [0, 1],
             "sentences": [{"sent_id": 0, "raw": "Man on the Right", "sent": "man on the right",
                            "tokens": ["man", "on", "the", "right"]},
                           {"sent_id": 1, "raw": "", "sent": "right guy",
                            "tokens": ["right", "guy"]}]},
            {"ref_id": 1, "ann_id": 100, "image_id": 9, "split": "testA", "category_id": 1,
             "file_name": "COCO_train2014_000000000009_100.jpg", "sent_ids": [2],
             "sentences": [{"sent_id": 2, "raw": "left person", "sent": "left person",
                            "tokens": ["left", "person"]}]}]
    refs_path = folder / "refs(unc).p"
    refs_path.write_bytes(pickle.dumps(refs, protocol=2))
    return refs_path, write_json(folder / "instances.json", instances)


def vcr_record(annot_id="val-0", **over):
    rec = {"annot_id": annot_id, "img_fn": "lsmdc_3001_21_JUMP_STREET/3001_21_JUMP_STREET_"
                                            "00.25.01.474-00.25.06.113@0.jpg",
           "objects": ["person", "person", "car"], "movie": "3001_21_JUMP_STREET",
           "question": ["What", "is", [0], "doing", "?"],
           "answer_choices": [[[0], "is", "driving", [2], "."], ["Sleeping", "."],
                              ["Talking", "to", [1], "."], ["Eating", "."]],
           "answer_label": 0,
           "rationale_choices": [[[0, 1], "are", "in", "a", "car", "."], ["No", "."],
                                 ["Yes", "."], ["Maybe", "."]],
           "rationale_label": 0, "question_number": 1}
    rec.update(over)
    return rec


def feature_world(tmp_path: Path, source: str, ids, **opts) -> Path:
    """A data folder holding BUTD features for ``ids`` under images/<source>/."""
    tsv = write_butd_tsv(tmp_path / f"{source}.tsv", make_images(ids))
    out = tmp_path / "data"
    run_import("butd-tsv", [tsv], out, source=source, **opts)
    return out
