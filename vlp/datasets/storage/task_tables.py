"""Task tables: the rows of one downstream benchmark split (vqa, retrieval, nlvr2, ve, refexp,
vcr), pointing at images by ``image_id``; their schemas, a validating writer and reader.

Written atomically and stamped with a content hash like the image shards (``shards``); every
violation raises one :class:`~vlp.datasets.storage.shards.ShardError` naming file, row and
field.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from vlp.contract.uri_files import location
from vlp.datasets.storage.shards import (_atomic_write_table, _read_parquet, _with_meta,
                                         content_hash, shard_info)
from vlp.datasets.storage.shard_checks import _first_bad
from vlp.datasets.storage.shard_format import FORMAT_VERSION, ShardError, ShardInfo

_S, _I, _F, _B = pa.string(), pa.int32(), pa.float32(), pa.bool_()
TASK_SCHEMAS: dict[str, pa.Schema] = {
    # VQA v2: 10 raw annotator answers per question; the answer vocabulary is built later.
    "vqa": pa.schema([("question_id", _S), ("image_id", _S), ("question", _S),
                      ("answers", pa.list_(_S))]),
    # Flickr30K-style retrieval: one row per (image, caption); 5 captions per image.
    "retrieval": pa.schema([("caption_id", _S), ("image_id", _S), ("caption", _S)]),
    # NLVR2: one statement about two images, true/false.
    "nlvr2": pa.schema([("id", _S), ("image_id_left", _S), ("image_id_right", _S),
                        ("statement", _S), ("label", _B)]),
    # SNLI-VE: image premise, text hypothesis.
    "ve": pa.schema([("id", _S), ("image_id", _S), ("hypothesis", _S), ("label", _S)]),
    # RefCOCO+: expression → target box; gt_boxes are the annotated objects of the image
    # (the "ground-truth boxes" setting); the detected setting uses the image shard's boxes.
    "refexp": pa.schema([("ref_id", _S), ("image_id", _S), ("expression", _S),
                         ("target_box", pa.list_(_F)), ("gt_boxes", pa.list_(_F)),
                         ("target_gt_index", _I)]),
    # VCR: question, 4 answers, 4 rationales, the right index of each.
    "vcr": pa.schema([("id", _S), ("image_id", _S), ("question", _S),
                      ("answers", pa.list_(_S)), ("answer_label", _I),
                      ("rationales", pa.list_(_S)), ("rationale_label", _I)]),
}
VE_LABELS = ("entailment", "neutral", "contradiction")


def write_task_table(path: str | os.PathLike, task: str, table: pa.Table | Mapping[str, list],
                     extra_meta: Mapping[str, Any] | None = None) -> ShardInfo:
    path = Path(path)
    if task not in TASK_SCHEMAS:
        raise ShardError(path, f"unknown task {task!r}; known: {sorted(TASK_SCHEMAS)}")
    schema = TASK_SCHEMAS[task]
    if not isinstance(table, pa.Table):
        missing = [n for n in schema.names if n not in table]
        if missing:  # (from_pydict would raise a bare KeyError that names no file)
            raise ShardError(path, f"missing required column(s) {missing}", field=missing[0])
        table = pa.Table.from_pydict(dict(table), schema=schema)
    table = _conform(table, schema, path)
    validate_task_table(table, task, path)
    digest = content_hash(table)
    meta = {"format_version": FORMAT_VERSION, "kind": f"task:{task}", "content_hash": digest,
            **(extra_meta or {})}
    _atomic_write_table(_with_meta(table, meta), path)
    return ShardInfo(str(path), f"task:{task}", table.num_rows, content_hash=digest,
                     extra=dict(extra_meta or {}))


def _conform(table: pa.Table, schema: pa.Schema, path) -> pa.Table:
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ShardError(path, f"missing required column(s) {missing}", field=missing[0])
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ShardError(path, f"columns do not match the schema {schema}: {e}") from None


def validate_task_table(table: pa.Table, task: str, path) -> None:
    schema = TASK_SCHEMAS[task]
    for name in schema.names:
        row = _first_bad(table.column(name).is_null())
        if row is not None:
            raise ShardError(path, "null value", row, name)
    for name in schema.names:
        if schema.field(name).type == pa.string():
            row = _first_bad(pc.equal(pc.utf8_length(table.column(name)), 0))
            if row is not None:
                raise ShardError(path, "empty string", row, name)
    if task == "vqa":
        row = _first_bad(pc.equal(pc.list_value_length(table.column("answers")), 0))
        if row is not None:
            raise ShardError(path, "no annotator answers", row, "answers")
    elif task == "ve":
        row = _first_bad(pc.invert(pc.is_in(table.column("label"), pa.array(VE_LABELS))))
        if row is not None:
            raise ShardError(path, f"label {table.column('label')[row].as_py()!r}, expected one "
                                   f"of {VE_LABELS}", row, "label")
    elif task == "refexp":
        for col in ("target_box", "gt_boxes"):
            lens = pc.list_value_length(table.column(col)).to_numpy(zero_copy_only=False)
            row = _first_bad((lens % 4 != 0) | (lens == 0) | ((lens != 4) if col == "target_box"
                                                               else False))
            if row is not None:
                raise ShardError(path, f"{lens[row]} values, expected "
                                       f"{'4' if col == 'target_box' else 'a multiple of 4'}",
                                 row, col)
        ngt = pc.list_value_length(table.column("gt_boxes")).to_numpy(zero_copy_only=False) // 4
        idx = table.column("target_gt_index").to_numpy()
        row = _first_bad((idx < 0) | (idx >= ngt))
        if row is not None:
            raise ShardError(path, f"index {idx[row]} outside the {ngt[row]} gt boxes", row,
                             "target_gt_index")
    elif task == "vcr":
        for lst, lab in (("answers", "answer_label"), ("rationales", "rationale_label")):
            lens = pc.list_value_length(table.column(lst)).to_numpy(zero_copy_only=False)
            labels = table.column(lab).to_numpy()
            row = _first_bad((labels < 0) | (labels >= lens))
            if row is not None:
                raise ShardError(path, f"label {labels[row]} outside the {lens[row]} choices",
                                 row, lab)


def read_task_table(path: str | os.PathLike, task: str | None = None, *,
                    validate: bool = True) -> tuple[pa.Table, ShardInfo]:
    path = location(path)
    table = _read_parquet(path, None)
    info = shard_info(path, table.schema, table.num_rows)
    kind = info.kind.removeprefix("task:")
    if not info.kind.startswith("task:") or kind not in TASK_SCHEMAS:
        raise ShardError(path, f"kind {info.kind!r}, expected a task table")
    if task is not None and kind != task:
        raise ShardError(path, f"holds task {kind!r}, expected {task!r}")
    if validate:
        _conform(table, TASK_SCHEMAS[kind], path)
        validate_task_table(table.cast(TASK_SCHEMAS[kind].with_metadata(table.schema.metadata)),
                            kind, path)
    return table, info
