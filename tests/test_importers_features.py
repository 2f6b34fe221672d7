"""Feature importers round-trip their public formats into valid image shards."""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_importers_fixtures import (DIM, make_images, write_butd_tsv, write_json, write_lxmert_tsv,
                                     write_uniter_npz)
from vlp.datasets.importers import run_import
from vlp.datasets.storage.shards import decode_features, read_image_shard
from vlp.datasets.storage.world import load_manifest


def _rows(out, source):
    world = load_manifest(out)  # also checks that every listed file exists
    files = world.image_files(source)
    assert files, world.sources
    rows = {}
    for f in files:
        table, info = read_image_shard(f)
        for r in table.to_pylist():
            rows[r["image_id"]] = (r, info)
    return world, rows


def test_butd_tsv_round_trip(tmp_path):
    images = make_images([391895, 9], boxes=4)
    tsv = write_butd_tsv(tmp_path / "trainval_36.tsv", images)
    report = run_import("butd-tsv", [tsv], tmp_path / "data", source="coco")
    assert report.counts == {"images": 2, "shards": 1}
    world, rows = _rows(tmp_path / "data", "coco")
    assert world.feature_dim == DIM and world.feature_extractor == "butd-r101-vg"
    assert world.sources["coco"].domain == "in" and world.sources["coco"].images == 2
    row, info = rows["391895"]
    assert (row["width"], row["height"], row["num_boxes"]) == (64, 48, 4)
    np.testing.assert_allclose(np.reshape(row["boxes"], (-1, 4)), images[0]["boxes"])
    np.testing.assert_allclose(decode_features(row["features"], DIM), images[0]["features"],
                               rtol=1e-3, atol=1e-3)  # stored as fp16
    assert row["confidences"] == [1.0] * 4 and row["captions"] is None
    assert info.feature_extractor == "butd-r101-vg"
    assert "set to 1.0" in info.extra["confidences"]


def test_butd_tsv_several_files_and_shards(tmp_path):
    a = write_butd_tsv(tmp_path / "a.tsv", make_images([1, 2, 3]))
    b = write_butd_tsv(tmp_path / "b.tsv", make_images([4, 5], seed=1))
    report = run_import("butd-tsv", [a, b], tmp_path / "data", source="vg", shard_mb=0.0002,
                        feature_extractor="my-detector", split="val")
    assert report.counts["images"] == 5 and report.counts["shards"] > 1
    world, rows = _rows(tmp_path / "data", "vg")
    assert sorted(rows) == ["1", "2", "3", "4", "5"]
    assert set(world.sources["vg"].files) == {"val"}
    assert all(r["split"] == "val" for r, _ in rows.values())
    assert world.feature_extractor == "my-detector"


def test_lxmert_tsv_round_trip(tmp_path):
    images = make_images(["COCO_val2014_000000391895", "COCO_train2014_000000000009"])
    tsv = write_lxmert_tsv(tmp_path / "val2014_obj36.tsv", images)
    run_import("lxmert-tsv", [tsv], tmp_path / "data", source="coco")
    world, rows = _rows(tmp_path / "data", "coco")
    assert sorted(rows) == ["391895", "9"]  # canonical COCO ids
    row, info = rows["391895"]
    assert (row["width"], row["height"]) == (64, 48)  # img_h comes before img_w in the file
    np.testing.assert_allclose(row["confidences"], images[0]["conf"], rtol=1e-6)
    soft = np.frombuffer(row["soft_labels"], "<f2").reshape(row["num_boxes"], 1601)
    assert (soft.argmax(1) == images[0]["objects"] + 1).all() and (soft.sum(1) == 1).all()
    assert world.num_classes == 1601 and len(world.class_names) == 1601


def test_lxmert_without_soft_labels_and_class_names(tmp_path):
    tsv = write_lxmert_tsv(tmp_path / "x.tsv", make_images([1]))
    run_import("lxmert-tsv", [tsv], tmp_path / "data", source="nlvr2", soft_labels="none")
    world, rows = _rows(tmp_path / "data", "nlvr2")
    assert rows["1"][0]["soft_labels"] is None and world.num_classes == 0
    assert world.sources["nlvr2"].domain == "downstream"


def test_uniter_npz_with_real_sizes(tmp_path):
    images = make_images(["coco_val2014_000000391895", "coco_val2014_000000000042"])
    folder = write_uniter_npz(tmp_path / "npz", images)
    sizes = write_json(tmp_path / "instances_val2014.json",
                       {"images": [{"id": 391895, "width": 64, "height": 48},
                                   {"id": 42, "width": 64, "height": 48}]})
    run_import("uniter-npz", [folder], tmp_path / "data", source="coco",
               image_sizes=str(sizes))
    world, rows = _rows(tmp_path / "data", "coco")
    row, info = rows["391895"]
    np.testing.assert_allclose(np.reshape(row["boxes"], (-1, 4)), images[0]["boxes"],
                               rtol=1e-5, atol=1e-4)
    assert world.num_classes == 5 and row["soft_labels"] is not None
    assert info.extra["image_size"] == "from instances_val2014.json"


def test_uniter_npz_nominal_canvas_keeps_normalised_boxes(tmp_path):
    images = make_images(["coco_val2014_000000391895"])
    folder = write_uniter_npz(tmp_path / "npz", images)
    run_import("uniter-npz", [folder / "coco_val2014_000000391895.npz"], tmp_path / "data",
               source="coco", nominal_size=1000)
    _, rows = _rows(tmp_path / "data", "coco")
    row, info = rows["391895"]
    assert (row["width"], row["height"]) == (1000, 1000)
    normalised = np.reshape(row["boxes"], (-1, 4)) / 1000
    np.testing.assert_allclose(normalised, images[0]["boxes"] / [64, 48, 64, 48], atol=1e-6)
    assert "nominal" in info.extra["image_size"]


def test_uniter_npz_needs_a_size_decision(tmp_path):
    folder = write_uniter_npz(tmp_path / "npz", make_images(["a"]))
    with pytest.raises(ValueError, match="--image-sizes FILE .* or --nominal-size"):
        run_import("uniter-npz", [folder], tmp_path / "data", source="x")


def test_one_world_one_feature_width(tmp_path):
    out = tmp_path / "data"
    run_import("butd-tsv", [write_butd_tsv(tmp_path / "a.tsv", make_images([1]))], out,
               source="coco")
    wide = write_butd_tsv(tmp_path / "b.tsv", make_images([2], dim=DIM * 2))
    with pytest.raises(ValueError, match="holds 16-d features"):
        run_import("butd-tsv", [wide], out, source="vg")
    other = write_butd_tsv(tmp_path / "c.tsv", make_images([3]))
    with pytest.raises(ValueError, match="extractor 'butd-r101-vg'"):
        run_import("butd-tsv", [other], out, source="cc", feature_extractor="vinvl-x152c4")
    assert not (out / "images" / "vg").exists() and not (out / "images" / "cc").exists()
    assert list(json.loads((out / "manifest.json").read_text())["sources"]) == ["coco"]


def test_existing_source_needs_overwrite(tmp_path):
    tsv = write_butd_tsv(tmp_path / "a.tsv", make_images([1]))
    run_import("butd-tsv", [tsv], tmp_path / "data", source="coco")
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_import("butd-tsv", [tsv], tmp_path / "data", source="coco")
    run_import("butd-tsv", [tsv], tmp_path / "data", source="coco", overwrite=True)
    assert load_manifest(tmp_path / "data").sources["coco"].images == 1


def test_append_adds_a_split_to_a_source(tmp_path):
    out = tmp_path / "data"
    train = write_lxmert_tsv(tmp_path / "train_obj36.tsv",
                             make_images(["train-1-0-img0", "train-1-0-img1"]))
    dev = write_lxmert_tsv(tmp_path / "valid_obj36.tsv",
                           make_images(["dev-2-0-img0", "dev-2-0-img1"], seed=3))
    run_import("lxmert-tsv", [train], out, source="nlvr2", split="train")
    first = sorted(p.name for p in (out / "images" / "nlvr2").iterdir())
    inode = (out / "images" / "nlvr2" / first[0]).stat().st_ino
    report = run_import("lxmert-tsv", [dev], out, source="nlvr2", split="val", append=True)
    assert report.counts == {"images": 2, "shards": 1}
    world, rows = _rows(out, "nlvr2")
    assert world.sources["nlvr2"].splits == {"train": 2, "val": 2}
    assert world.sources["nlvr2"].images == 4
    assert rows["dev-2-0-img0"][0]["split"] == "val" and rows["train-1-0-img1"][0]["split"] == \
        "train"
    assert (out / "images" / "nlvr2" / first[0]).stat().st_ino == inode  # linked, not copied
    from vlp.datasets.importers import InputFormatError
    with pytest.raises(InputFormatError, match=r"image id 'dev-2-0-img0' appears twice \(first "
                                               r"at .*val-00000.parquet: an earlier import\)"):
        run_import("lxmert-tsv", [dev], out, source="nlvr2", split="test", append=True)
    more = write_lxmert_tsv(tmp_path / "more.tsv", make_images(["train-9-0-img0"], seed=4))
    run_import("lxmert-tsv", [more], out, source="nlvr2", split="train", append=True)
    world = load_manifest(out)
    assert [f.rsplit("/", 1)[1] for f in world.sources["nlvr2"].files["train"]] == [
        "train-00000.parquet", "train-00001.parquet"]
