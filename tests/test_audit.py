"""The leakage audit: a clean world passes; planted leaks are found however they hide."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from vlp.datasets.audit.leakage import audit_world
from vlp.datasets.storage.shards import read_image_shard, write_image_shard
from vlp.datasets.storage.task_tables import read_task_table, write_task_table
from vlp.contract.atomic_write import write_json_atomic
from vlp.datasets.storage.world import load_manifest


@pytest.fixture
def world_copy(tiny_world, tmp_path):
    return shutil.copytree(tiny_world, tmp_path / "world")


def _plant(world, source: str, rows: pa.Table) -> None:
    """Add ``rows`` as a new shard of ``source`` and list it in the manifest."""
    m = load_manifest(world)
    rel = f"images/{source}/train-00099.parquet"
    write_image_shard(world / rel, rows, feature_extractor=m.feature_extractor,
                      feature_dim=m.feature_dim, num_classes=m.num_classes)
    raw = json.loads((world / "manifest.json").read_text())
    raw["sources"][source]["files"]["train"].append(rel)
    write_json_atomic(world / "manifest.json", raw)


def _test_image(world, k: int = 0) -> pa.Table:
    table, _ = read_image_shard(load_manifest(world).image_files("downstream", "test")[0])
    return table.slice(k, 1)


def _set(table: pa.Table, **columns) -> pa.Table:
    for name, value in columns.items():
        i = table.column_names.index(name)
        table = table.set_column(i, table.schema.field(i), pa.array([value],
                                                                      table.schema.field(i).type))
    return table


def test_clean_world_has_no_leaks(tiny_world, capsys):
    from vlp.cli import main

    report = audit_world(tiny_world)
    assert report.ok and report.leaks == [] and report.problems == [] and report.warnings == []
    assert report.sources["coco"]["pairs"] == 400
    assert report.stats["tokens_per_caption"]["mean"] > 3
    assert report.stats["class_histogram"]["__background__"] > 0
    assert main(["data", "audit", str(tiny_world)]) == 0
    assert "no leakage" in capsys.readouterr().out
    assert main(["data", "audit", str(tiny_world), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_leaks"] == 0


def test_leak_under_another_id_is_found_by_content(world_copy, capsys):
    from vlp.cli import main

    row = _test_image(world_copy)
    test_id = row.column("image_id")[0].as_py()
    _plant(world_copy, "coco", _set(row, image_id="coco_777777", source="coco", split="train"))
    report = audit_world(world_copy)
    assert not report.ok and len(report.leaks) == 1
    leak = report.leaks[0]
    assert (leak.image_id, leak.split, leak.found_in, leak.found_id) == (
        test_id, "test", "coco:train", "coco_777777")
    assert leak.matched_by == ["features", "pixels"]
    assert main(["data", "audit", str(world_copy)]) == 1
    out = capsys.readouterr().out
    assert "LEAKAGE" in out and test_id in out and "coco_777777" in out


def test_leak_with_reencoded_pixels_and_new_features_is_found(world_copy):
    row = _test_image(world_copy, 1)
    png = Image.open(io.BytesIO(row.column("pixels")[0].as_py()))
    buf = io.BytesIO()
    png.save(buf, format="PNG", compress_level=1)          # same picture, other bytes
    feats = np.frombuffer(row.column("features")[0].as_py(), "<f2").copy()
    feats[0] += 1                                           # re-extracted features
    _plant(world_copy, "sbu", _set(row, image_id="sbu_x", source="sbu", split="train",
                                   pixels=buf.getvalue(), features=feats.tobytes()))
    [leak] = audit_world(world_copy).leaks
    assert leak.matched_by == ["pixels"] and leak.found_in == "sbu:train"


def test_same_id_leak_into_pretraining_matches_every_key(world_copy):
    row = _test_image(world_copy, 2)
    _plant(world_copy, "vg", _set(row, source="vg", split="train"))
    [leak] = audit_world(world_copy).leaks
    assert leak.matched_by == ["image_id", "features", "pixels"]


def test_task_table_pointing_at_another_split_is_a_leak(world_copy):
    m = load_manifest(world_copy)
    table, _ = read_task_table(m.task_file("vqa", "test"), "vqa")
    train_id = read_image_shard(m.image_files("downstream", "train")[0])[0] \
        .column("image_id")[0].as_py()
    rows = table.to_pylist()
    rows[0]["image_id"] = train_id
    write_task_table(m.task_file("vqa", "test"), "vqa",
                     pa.Table.from_pylist(rows, schema=table.schema.remove_metadata()))
    report = audit_world(world_copy)
    assert [(l.image_id, l.matched_by) for l in report.leaks] == [(train_id,
                                                                    ["task_reference"])]


def test_unlisted_shard_is_a_warning(world_copy):
    shutil.copy(world_copy / "images/vg/train-00000.parquet",
                world_copy / "images/vg/stray.parquet")
    report = audit_world(world_copy)
    assert report.ok and any("stray.parquet" in w for w in report.warnings)
