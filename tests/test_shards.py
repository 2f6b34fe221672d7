"""Bad inputs to the shard format: each gives one ShardError naming the file and the problem,
on write (and nothing is left in the folder) and on read (for files written around the
writer)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vlp.datasets.storage.shards import _with_meta, image_table, read_image_shard, write_image_shard
from vlp.datasets.storage.task_tables import read_task_table, write_task_table
from vlp.datasets.storage.shard_format import ShardError

D, C = 8, 4


def _row(**over) -> dict:
    row = {"image_id": "img_0", "source": "coco", "split": "train", "width": 32, "height": 32,
           "boxes": [[1, 1, 10, 10], [5, 5, 30, 31]], "confidences": [0.9, 0.4],
           "features": np.ones((2, D)), "soft_labels": np.full((2, C), 0.25),
           "captions": ["a red ball."]}
    return row | over


def _write(path, table, feature_dim=D):
    return write_image_shard(path, table, feature_extractor="test", feature_dim=feature_dim,
                             num_classes=C)


def _write_unchecked(path, table, feature_dim=D) -> None:
    """What a buggy or foreign writer might leave: the metadata without the validation."""
    pq.write_table(_with_meta(table, {"format_version": "1", "kind": "images",
                                      "feature_extractor": "test", "feature_dim": feature_dim,
                                      "num_classes": C}), path)


BAD = {
    "features of another width": (dict(features=np.ones((2, D // 2))),
                                  "features", "expected num_boxes × feature_dim × 2"),
    "NaN in features": (dict(features=np.array([[np.nan] * D, [1.0] * D])), "features",
                        "NaN or Inf"),
    "Inf in features": (dict(features=np.array([[1.0] * D, [np.inf] * D])), "features",
                        "NaN or Inf"),
    "box outside the image": (dict(boxes=[[1, 1, 10, 10], [5, 5, 40, 31]]), "boxes",
                              "lies outside the 32x32 image"),
    "empty caption list": (dict(captions=[]), "captions", "empty caption list"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_rows_are_refused_on_write_and_leave_nothing(tmp_path, case):
    over, field, problem = BAD[case]
    path = tmp_path / "out" / "train-00000.parquet"
    table = image_table([_row(), _row(image_id="img_1", **over)], D, C)
    with pytest.raises(ShardError) as e:
        _write(path, table)
    assert (e.value.field, e.value.row) == (field, 1)
    assert str(path) in str(e.value) and problem in str(e.value)
    assert not path.parent.exists() or os.listdir(path.parent) == []


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_rows_are_caught_on_read(tmp_path, case):
    over, field, problem = BAD[case]
    path = tmp_path / "bad.parquet"
    _write_unchecked(path, image_table([_row(), _row(image_id="img_1", **over)], D, C))
    with pytest.raises(ShardError) as e:
        read_image_shard(path)
    assert (e.value.field, e.value.row) == (field, 1)
    assert str(path) in str(e.value) and problem in str(e.value)


def test_feature_width_mismatch_with_declared_dim(tmp_path):
    path = tmp_path / "x.parquet"
    with pytest.raises(ShardError, match=r"16 bytes, expected .* = 2 × 16 × 2 = 64"):
        _write(path, image_table([_row(features=np.ones((2, 4)))], 4, C), feature_dim=16)
    assert os.listdir(tmp_path) == []


def test_truncated_parquet_file(tmp_path):
    path = tmp_path / "train-00000.parquet"
    _write(path, image_table([_row(), _row(image_id="img_1")], D, C))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError, match="not a readable Parquet file") as e:
        read_image_shard(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("column", ["boxes", "features", "image_id"])
def test_missing_required_column(tmp_path, column):
    path = tmp_path / "out" / "train-00000.parquet"
    table = image_table([_row()], D, C).drop_columns([column])
    with pytest.raises(ShardError, match=rf"missing required column\(s\) \['{column}'\]") as e:
        _write(path, table)
    assert str(path) in str(e.value) and e.value.field == column
    assert not path.parent.exists() or os.listdir(path.parent) == []
    read_path = tmp_path / "foreign.parquet"
    _write_unchecked(read_path, table)
    with pytest.raises(ShardError, match="missing required column") as e:
        read_image_shard(read_path)
    assert str(read_path) in str(e.value)


def test_optional_columns_may_be_left_out(tmp_path):
    path = tmp_path / "x.parquet"
    _write(path, image_table([_row()], D, C).drop_columns(["pixels", "captions"]))
    table, _ = read_image_shard(path)
    assert table.column("captions").null_count == 1


def test_rows_changed_after_writing_are_detected(tmp_path):
    path = tmp_path / "x.parquet"
    _write(path, image_table([_row(), _row(image_id="img_1")], D, C))
    table = pq.read_table(path)
    edited = table.set_column(0, "image_id", pa.array(["img_0", "img_9"]))
    pq.write_table(edited.replace_schema_metadata(table.schema.metadata), path)
    with pytest.raises(ShardError, match="content hash does not match"):
        read_image_shard(path)


def test_sliced_rows_hash_like_their_parquet_copy(tmp_path):
    table = image_table([_row(), _row(image_id="img_1"), _row(image_id="img_2")], D, C)
    path = tmp_path / "x.parquet"
    _write(path, table.slice(1, 1))
    assert read_image_shard(path)[0].column("image_id").to_pylist() == ["img_1"]


def test_task_table_missing_column_and_bad_values(tmp_path):
    path = tmp_path / "tasks" / "vqa" / "train.parquet"
    with pytest.raises(ShardError, match=r"missing required column\(s\) \['answers'\]") as e:
        write_task_table(path, "vqa", {"question_id": ["q"], "image_id": ["i"],
                                       "question": ["what?"]})
    assert str(path) in str(e.value)
    with pytest.raises(ShardError, match="no annotator answers"):
        write_task_table(path, "vqa", {"question_id": ["q"], "image_id": ["i"],
                                       "question": ["what?"], "answers": [[]]})
    assert not path.parent.exists() or os.listdir(path.parent) == []
    write_task_table(path, "vqa", {"question_id": ["q"], "image_id": ["i"],
                                   "question": ["what?"], "answers": [["yes"] * 10]})
    data = path.read_bytes()
    path.write_bytes(data[:-20])
    with pytest.raises(ShardError, match="not a readable Parquet file"):
        read_task_table(path)
