"""Caption importers attach their public formats' captions to image shards by image id."""

from __future__ import annotations

import hashlib

import pytest

from test_importers_fixtures import feature_world, karpathy_doc, write_json
from vlp.datasets.importers import InputFormatError, run_import
from vlp.datasets.storage.shards import read_image_shard
from vlp.datasets.storage.world import load_manifest


def _captions(out, source):
    world = load_manifest(out)
    rows = {}
    for f in world.image_files(source):
        table, _ = read_image_shard(f)
        rows.update({r["image_id"]: r for r in table.to_pylist()})
    return world, rows


def test_karpathy_coco_sets_captions_and_splits(tmp_path):
    out = feature_world(tmp_path, "coco", [391895, 9, 42])
    doc = karpathy_doc("coco", [
        ("COCO_val2014_000000391895.jpg", 391895, "test", ["A man rides a bike.",
                                                          "A  cyclist\non a road."]),
        ("COCO_train2014_000000000009.jpg", 9, "restval", ["Food on a plate."])])
    report = run_import("karpathy", [write_json(tmp_path / "dataset_coco.json", doc)], out)
    assert report.counts["captions_added"] == 3 and report.counts["captioned_images"] == 2
    world, rows = _captions(out, "coco")
    assert rows["391895"]["captions"] == ["A man rides a bike.", "A cyclist on a road."]
    assert rows["391895"]["split"] == "test" and rows["9"]["split"] == "train"
    assert rows["42"]["captions"] is None and rows["42"]["split"] == "train"
    assert set(world.sources["coco"].files) == {"train", "test"}
    assert world.sources["coco"].splits == {"test": 1, "train": 2}
    assert world.sources["coco"].pairs == 3
    assert all(f.name.startswith(("train-", "test-")) for f in world.image_files("coco"))
    # re-running the same import changes nothing (repeats are skipped)
    again = run_import("karpathy", [tmp_path / "dataset_coco.json"], out)
    assert again.counts["captions_added"] == 0 and again.counts["captions"] == 3


def test_karpathy_flickr_uses_file_names(tmp_path):
    out = feature_world(tmp_path, "flickr30k", [1000092795])
    doc = karpathy_doc("flickr30k", [("1000092795.jpg", None, "train", ["Two young guys."])])
    run_import("karpathy", [write_json(tmp_path / "dataset_flickr30k.json", doc)], out)
    _, rows = _captions(out, "flickr30k")
    assert rows["1000092795"]["captions"] == ["Two young guys."]


def test_captions_without_features_are_counted(tmp_path):
    out = feature_world(tmp_path, "coco", [9])
    doc = karpathy_doc("coco", [("COCO_train2014_000000000009.jpg", 9, "train", ["a"]),
                                ("COCO_train2014_000000000077.jpg", 77, "train", ["b", "c"]),
                                ("COCO_train2014_000000000078.jpg", 78, "val", ["d"])])
    path = write_json(tmp_path / "dataset_coco.json", doc)
    with pytest.raises(InputFormatError) as e:
        run_import("karpathy", [path], out)
    assert str(e.value) == (f"{path}: images[1] (image 77).sentences[0]: image '77' has no "
                            f"features in {out}/images/coco; 3 caption(s) of 2 image(s) lack "
                            f"features (pass --allow-missing-features to drop them)")
    report = run_import("karpathy", [path], out, allow_missing_features=True)
    assert report.counts["dropped_captions_without_features"] == 3
    assert "dropped 3 caption(s) of 2 image(s)" in report.notes[0]


def test_vg_region_descriptions(tmp_path):
    out = feature_world(tmp_path, "vg", [1, 2])
    regions = [{"id": 1, "regions": [
        {"region_id": 10, "image_id": 1, "phrase": "a red car", "x": 0, "y": 0, "width": 5,
         "height": 5},
        {"region_id": 11, "image_id": 1, "phrase": "a red car", "x": 1, "y": 1, "width": 5,
         "height": 5},
        {"region_id": 12, "image_id": 1, "phrase": " ", "x": 1, "y": 1, "width": 5,
         "height": 5}]},
        {"image_id": 2, "regions": [{"region_id": 13, "image_id": 2, "phrase": "tree",
                                     "x": 0, "y": 0, "width": 3, "height": 3}]}]
    report = run_import("vg-regions", [write_json(tmp_path / "region_descriptions.json",
                                                  regions)], out)
    assert report.counts["skipped_blank_phrases"] == 1
    _, rows = _captions(out, "vg")
    assert rows["1"]["captions"] == ["a red car"] and rows["2"]["captions"] == ["tree"]


def test_conceptual_captions_tsv(tmp_path):
    url0 = "http://example.com/a/pic0.jpg"
    sha = hashlib.sha1(url0.encode()).hexdigest()
    out = feature_world(tmp_path, "cc", [0, 1])
    tsv = tmp_path / "Train_GCC-training.tsv"
    tsv.write_text(f'a "quoted" caption\t{url0}\nsecond one\thttp://example.com/pic1.png\n')
    run_import("cc-tsv", [tsv], out)
    _, rows = _captions(out, "cc")
    assert rows["0"]["captions"] == ['a "quoted" caption']
    assert rows["1"]["captions"] == ["second one"]
    # ids derived from URLs instead of line numbers
    (tmp_path / "x.tsv").write_text(f"sha caption\t{url0}\n")
    tsv2 = tmp_path / "feat_sha.tsv"
    from test_importers_fixtures import make_images, write_butd_tsv
    write_butd_tsv(tsv2, make_images([sha]))
    run_import("butd-tsv", [tsv2], out, source="cc2", domain="out")
    run_import("cc-tsv", [tmp_path / "x.tsv"], out, source="cc2", id_from="url-sha1")
    _, rows = _captions(out, "cc2")
    assert rows[sha]["captions"] == ["sha caption"]


def test_sbu_two_files(tmp_path):
    out = feature_world(tmp_path, "sbu", ["4385058960_b0f291553e", "111_aa"])
    urls = tmp_path / "SBU_captioned_photo_dataset_urls.txt"
    caps = tmp_path / "SBU_captioned_photo_dataset_captions.txt"
    urls.write_text("http://static.flickr.com/2723/4385058960_b0f291553e.jpg\n"
                    "http://static.flickr.com/1/111_aa.jpg\n")
    caps.write_text("Man sits in a boat\nthe sky at dusk\n")
    run_import("sbu", [urls, caps], out, id_from="url-stem")
    world, rows = _captions(out, "sbu")
    assert rows["4385058960_b0f291553e"]["captions"] == ["Man sits in a boat"]
    assert world.sources["sbu"].domain == "out" and world.sources["sbu"].pairs == 2
    with pytest.raises(InputFormatError, match="give the URL file first"):
        run_import("sbu", [caps, urls], out, id_from="url-stem")


def test_features_from_another_folder(tmp_path):
    feats = feature_world(tmp_path, "coco", [9])
    doc = karpathy_doc("coco", [("COCO_train2014_000000000009.jpg", 9, "val", ["x"])])
    out = tmp_path / "other"
    run_import("karpathy", [write_json(tmp_path / "d.json", doc)], out,
               features=str(feats / "images" / "coco"))
    world, rows = _captions(out, "coco")
    assert rows["9"]["split"] == "val" and world.feature_dim == 16
    # the source folder is untouched
    _, before = _captions(feats, "coco")
    assert before["9"]["captions"] is None
