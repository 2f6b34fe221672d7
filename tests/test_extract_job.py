"""`vlp data extract` through Ray Data (the session's local Ray): shards that validate, their
metadata, a corrupt image reported and skipped, a rerun that skips what is written."""

from __future__ import annotations

import json

import numpy as np
from PIL import Image

GRID = ["--model", "grid-tiny", "--grid", "4", "--short-side", "64", "--long-side", "96",
        "--batch-size", "2", "--workers", "2"]


def _images(folder):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(5):
        im = Image.fromarray((rng.random((40 + 8 * i, 60, 3)) * 255).astype(np.uint8))
        im.save(folder / (f"COCO_val2014_{i + 1:012d}.jpg" if i % 2 else f"photo{i}.png"))
    good = (folder / "COCO_val2014_000000000002.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(good[: len(good) // 3])
    (folder / "notes.png").write_bytes(b"not an image")
    return folder


def test_extract_writes_validated_shards_reports_bad_images_and_resumes(ray_local, tmp_path,
                                                                         capsys):
    from vlp.cli import main
    from vlp.datasets.storage.shards import list_shards, read_image_shard
    from vlp.datasets.storage.world import load_manifest

    imgs, out = _images(tmp_path / "imgs"), tmp_path / "world"
    args = ["data", "extract", "--images", str(imgs), "--source", "coco", "--split", "val",
            "--out", str(out), "--images-per-shard", "3"] + GRID
    assert main(args) == 3      # finished, with failed images
    captured = capsys.readouterr()
    failed = [ln for ln in captured.err.splitlines() if ln.startswith("extract: failed:")]
    assert len(failed) == 2
    assert any("truncated.jpg: truncated at byte" in ln for ln in failed)
    assert any("notes.png: not an image" in ln for ln in failed)
    shards = list_shards(out / "images" / "coco")
    # the write stage takes ≤ 3 rows (failures included) a shard
    assert 2 <= len(shards) <= 4
    assert f"5 images written in {len(shards)} shard(s)" in captured.out
    assert "2 failed" in captured.out

    assert main(["data", "validate", str(out)]) == 0
    ids, rows = set(), 0
    for f in shards:
        table, info = read_image_shard(f)
        ids |= set(table.column("image_id").to_pylist())
        rows += table.num_rows
        assert info.feature_extractor == "grid-tiny" and info.feature_dim == 64
        assert info.extra["weights_sha256"] == "random-init"
        assert "grid=4" in info.extra["extract_settings"]
        assert "short_side=64" in info.extra["extract_settings"]
        assert set(table.column("num_boxes").to_pylist()) == {16}
        assert table.column("image_feature").null_count == 0
    assert rows == 5 and ids == {"photo0", "2", "photo2", "4", "photo4"}
    world = load_manifest(out)
    assert world.feature_extractor == "grid-tiny" and world.feature_dim == 64
    assert world.sources["coco"].splits == {"val": 5}
    assert json.loads((out / "meta/imports.jsonl").read_text().splitlines()[-1])[
        "counts"] == {"images": 5, "skipped": 0, "failed": 2}

    # an interruption after the first shard: the rerun extracts only what is missing
    (imgs / "truncated.jpg").unlink()
    (imgs / "notes.png").unlink()
    last = shards[-1]
    lost = set(read_image_shard(last)[0].column("image_id").to_pylist())
    last.unlink()
    assert main(args) == 0
    captured = capsys.readouterr()
    assert (f"{len(lost)} images written in 1 shard(s)" in captured.out
            and f"({5 - len(lost)} skipped as already extracted, 0 failed)" in captured.out)
    assert main(["data", "validate", str(out)]) == 0
    assert load_manifest(out).sources["coco"].images == 5

    # other settings into the same folder would mix stores: refused before anything runs
    assert main(args[:-len(GRID)] + GRID[:2] + ["--grid", "5", "--short-side", "64",
                                                "--long-side", "96"]) == 2
    assert "holds features of 'grid-tiny'" in capsys.readouterr().err


def test_butd_tiny_through_the_job(ray_local, tmp_path, capsys):
    """The detector family through the same job (runs once vlp.models.vision.detection.butd,
    the detector's own area, is in the tree): regions within the box limits, soft labels
    summing to 1, the whole-image feature, shards that validate."""
    import pytest
    pytest.importorskip("vlp.models.vision.detection.butd")
    from vlp.cli import main
    from vlp.datasets.storage.shards import decode_features, list_shards, read_image_shard

    imgs, out = _images(tmp_path / "imgs"), tmp_path / "world"
    (imgs / "truncated.jpg").unlink()
    (imgs / "notes.png").unlink()
    assert main(["data", "extract", "--images", str(imgs), "--model", "butd-tiny",
                 "--source", "coco", "--out", str(out), "--short-side", "96",
                 "--long-side", "128", "--min-boxes", "2", "--max-boxes", "6",
                 "--workers", "2", "--batch-size", "2"]) == 0
    assert "5 images written" in capsys.readouterr().out
    assert main(["data", "validate", str(out)]) == 0
    for f in list_shards(out / "images" / "coco"):
        table, info = read_image_shard(f)
        assert info.feature_extractor == "butd-tiny" and info.num_classes
        for row in table.to_pylist():
            assert 2 <= row["num_boxes"] <= 6 and row["image_feature"] is not None
            soft = decode_features(row["soft_labels"], info.num_classes).astype(np.float32)
            np.testing.assert_allclose(soft.sum(1), 1.0, atol=1e-2)
