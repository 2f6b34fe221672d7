"""Karpathy-split caption files (``dataset_coco.json``, ``dataset_flickr30k.json``).

Format: ``{"dataset": "coco"|"flickr30k", "images": [{"filename", "imgid", "split",
"sentences": [{"raw", "tokens", "sentid", "imgid"}], "sentids", ["filepath", "cocoid"]}]}``
with splits train / restval / val / test.

Two importers read it:

- ``karpathy`` attaches the captions (``raw``) to image shards and sets each image's split
  from the file (restval → train, as UNITER trains on it). Image ids: ``cocoid`` when
  present, else the file name (``1000092795.jpg`` → ``1000092795``).
- ``karpathy-retrieval`` writes one split (default test) as a ``retrieval`` task table, one
  row per caption (caption_id = ``sentid``), to ``tasks/retrieval/<dataset>_<split>.parquet``
  — e.g. ``flickr30k_test`` for the Flickr30K IR/TR benchmark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from vlp.datasets.importers.caption_merge import ALLOW_MISSING, FEATURES, Captions, merge_captions
from vlp.datasets.importers.import_error import InputFormatError
from vlp.datasets.importers.image_ids import canonical_image_id
from vlp.datasets.importers.readers import load_json, need, need_list
from vlp.datasets.importers.registry import Importer, ImportReport, Option, register
from vlp.datasets.importers.task_import import (ALLOW_MISSING_IMAGES, IMAGES, NAME, TaskRows,
                                                write_tasks)

KARPATHY_SPLITS = {"train": "train", "restval": "train", "val": "val", "test": "test"}


def _images(path: Path) -> tuple[str, Iterator[tuple[str, str, str, list[tuple[str, str, str]]]]]:
    """(dataset name, iterator of (record, image_id, split, [(sentence record, sentid, raw)]))."""
    doc = load_json(path)
    images = need_list(doc, "images", path)
    dataset = doc.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        raise InputFormatError(path, "top-level 'dataset' (coco / flickr30k) is missing")

    def it():
        for i, img in enumerate(images):
            rec = f"images[{i}]"
            if not isinstance(img, dict):
                raise InputFormatError(path, "expected an object", rec)
            if "cocoid" in img:
                image_id = canonical_image_id(need(img, "cocoid", int, path, rec))
            else:
                image_id = canonical_image_id(need(img, "filename", str, path, rec))
            rec = f"images[{i}] (image {image_id})"
            split = need(img, "split", str, path, rec)
            if split not in KARPATHY_SPLITS:
                raise InputFormatError(path, f"split {split!r}, expected one of "
                                             f"{sorted(KARPATHY_SPLITS)}", rec)
            sents = []
            for j, s in enumerate(need(img, "sentences", list, path, rec)):
                srec = f"{rec}.sentences[{j}]"
                sentid = need(s, "sentid", int, path, srec)
                if "raw" in s:
                    raw = need(s, "raw", str, path, srec)
                else:  # older dumps: tokens only
                    raw = " ".join(need(s, "tokens", list, path, srec))
                if not raw.strip():
                    raise InputFormatError(path, "empty sentence", srec)
                sents.append((srec, str(sentid), raw))
            yield rec, image_id, split, sents
    return dataset, it()


def run_captions(inputs: list[Path], out: Path, *, overwrite: bool, source: str | None,
                 features: str | None, allow_missing_features: bool) -> ImportReport:
    caps = Captions()
    sources = set()
    for path in inputs:
        dataset, images = _images(path)
        sources.add(dataset)
        for rec, image_id, split, sents in images:
            caps.set_split(image_id, KARPATHY_SPLITS[split], path, rec)
            for srec, _, raw in sents:
                caps.add(image_id, raw, path, srec)
    if source is None:
        if len(sources) != 1:
            raise ValueError(f"the inputs are from several datasets {sorted(sources)}: import "
                             f"them one at a time or pass --source")
        source = sources.pop()
    options = {"source": source, "features": features,
               "allow_missing_features": allow_missing_features}
    return merge_captions("karpathy", caps, inputs, out, source=source, features=features,
                          allow_missing_features=allow_missing_features, overwrite=overwrite,
                          options=options)


def run_retrieval(inputs: list[Path], out: Path, *, overwrite: bool, split: str,
                  name: str | None, images: str | None,
                  allow_missing_images: bool) -> ImportReport:
    path = inputs[0]
    dataset, it = _images(path)
    rows = TaskRows("retrieval")
    for rec, image_id, img_split, sents in it:
        if img_split != split:
            continue
        for srec, sentid, raw in sents:
            rows.add(path, srec, caption_id=sentid, image_id=image_id, caption=" ".join(
                raw.split()))
    if not len(rows):
        raise InputFormatError(path, f"no images in split {split!r}")
    options = {"split": split, "name": name, "images": images}
    return write_tasks("karpathy-retrieval", {name or f"{dataset}_{split}": rows}, inputs, out,
                       overwrite=overwrite, images=images,
                       allow_missing_images=allow_missing_images, options=options,
                       meta={"dataset": dataset})


register(Importer(
    name="karpathy", kind="captions",
    summary="COCO / Flickr30K captions, Karpathy-split JSON → captions on image shards",
    inputs="dataset_coco.json or dataset_flickr30k.json",
    description="Attaches every sentence's 'raw' text to the image with that id (cocoid, or "
                "the file name for Flickr30K) in OUT/images/SOURCE/, and sets each image's "
                "split from the file (train/restval → train, val, test), so a leakage audit "
                "can keep evaluation images out of pretraining. SOURCE defaults to the file's "
                "'dataset' (coco / flickr30k).",
    run=run_captions,
    options=(Option("--source", "image folder name (default: the file's 'dataset')"),
             FEATURES, ALLOW_MISSING)))

register(Importer(
    name="karpathy-retrieval", kind="task",
    summary="Karpathy-split JSON, one split (Flickr30K test) → retrieval task table",
    inputs="dataset_flickr30k.json (or dataset_coco.json)",
    description="One row per caption of the chosen split: caption_id (sentid), image_id, "
                "caption. Written to OUT/tasks/retrieval/<dataset>_<split>.parquet, e.g. "
                "flickr30k_test.parquet.",
    run=run_retrieval, max_inputs=1,
    options=(Option("--split", "which Karpathy split to import", default="test",
                    choices=("train", "restval", "val", "test")),
             NAME, IMAGES, ALLOW_MISSING_IMAGES)))
