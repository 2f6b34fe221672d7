"""The grid and pixels extractors and the extract CLI's checks (no Ray)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from vlp.models.vision.extractors.base import ExtractSettings
from vlp.models.vision.extractors.registry import build_extractor

SMALL = ExtractSettings(short_side=64, long_side=128, grid=4)


def _rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).random((h, w, 3)) * 255).astype(np.uint8)


def _run(extractor, images):
    prepared = [extractor.prepare(im) for im in images]
    return extractor.extract([torch.from_numpy(x) for x, _ in prepared],
                             [s for _, s in prepared], [im.shape[:2] for im in images])


def test_grid_cells_tile_the_image_and_match_the_contract():
    torch.manual_seed(0)
    ext = build_extractor("grid-tiny", None, SMALL)
    (out,) = _run(ext, [_rgb(50, 90)])
    boxes = out["boxes"]
    assert boxes.shape == (16, 4) and boxes.dtype == np.float32
    assert boxes[:, [0, 1]].min() == 0 and boxes[:, 2].max() == 90 and boxes[:, 3].max() == 50
    # G² cells of equal size, no overlap: their areas add up to the image's
    area = ((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])).sum()
    assert area == pytest.approx(50 * 90)
    assert out["features"].shape == (16, 64) and out["features"].dtype == np.float16
    assert np.isfinite(out["features"]).all() and out["image_feature"].shape == (64,)
    assert out["confidences"].shape == (16,) and out["soft_labels"] is None
    meta = ext.metadata()
    assert meta["extractor"] == "grid-tiny" and "grid=4" in meta["extract_settings"]


def test_grid_batched_features_equal_one_at_a_time():
    """Mixed sizes and aspects (landscape, portrait, square, odd sides) in one padded canvas:
    every image's cells and whole-image feature are those it gets alone (the mask keeps the
    padding out of the convolutions' borders and out of the cell averages)."""
    torch.manual_seed(0)
    ext = build_extractor("grid-tiny", None, SMALL)
    images = [_rgb(60, 80, 1), _rgb(60, 80, 2), _rgb(100, 50, 3), _rgb(77, 77, 4),
              _rgb(41, 130, 5)]
    assert len({ext.prepare(im)[0].shape for im in images}) == 4
    batched = _run(ext, images)
    for im, b in zip(images, batched):
        (alone,) = _run(ext, [im])
        np.testing.assert_allclose(b["features"].astype(np.float32),
                                   alone["features"].astype(np.float32), rtol=1e-3, atol=1e-3)
        np.testing.assert_allclose(b["image_feature"].astype(np.float32),
                                   alone["image_feature"].astype(np.float32),
                                   rtol=1e-3, atol=1e-3)
        np.testing.assert_array_equal(b["boxes"], alone["boxes"])


def test_landscape_and_portrait_images_get_a_canvas_each():
    from vlp.models.vision.extractors.padded_batch import orientation_groups
    shapes = [(600, 800), (1000, 600), (600, 600), (600, 1000), (900, 600)]
    assert orientation_groups([torch.zeros(h, w, 3) for h, w in shapes]) == [[0, 2, 3], [1, 4]]


def test_padding_without_the_mask_would_change_grid_features():
    """Why the mask: the same padded canvas with the hooks off gives other features for the
    smaller image (the padded area leaks in through the border convolutions and the cells)."""
    from vlp.models.vision.extractors import padded_batch

    torch.manual_seed(0)
    ext = build_extractor("grid-tiny", None, SMALL)
    images = [_rgb(64, 128, 1), _rgb(64, 80, 2)]      # one canvas, the second padded
    masked = _run(ext, images)

    class NoMask(padded_batch.Extents):
        def masked(self, x):
            return x
    real = padded_batch.Extents
    padded_batch.Extents = NoMask
    try:
        unmasked = _run(ext, images)
    finally:
        padded_batch.Extents = real
    diff = [np.abs(a["features"].astype(np.float32) - b["features"].astype(np.float32)).max()
            for a, b in zip(masked, unmasked)]
    assert max(diff) > 1e-2


def test_grid_weights_from_a_torchvision_state_dict(tmp_path):
    from vlp.models.vision.extractors.base import file_sha256
    torch.manual_seed(0)
    ext = build_extractor("grid-tiny", None, SMALL)
    state = {k: torch.randn_like(v) if v.is_floating_point() else v
             for k, v in ext.trunk.state_dict().items()}
    state["fc.weight"] = torch.zeros(10, 64)         # the classifier may be there
    path = tmp_path / "r.pt"
    torch.save(state, path)
    loaded = build_extractor("grid-tiny", str(path), SMALL)
    assert torch.equal(loaded.trunk.conv1.weight, state["conv1.weight"])
    assert loaded.metadata()["weights_sha256"] == file_sha256(path)
    del state["layer1.0.conv1.weight"]
    torch.save(state, path)
    with pytest.raises(ValueError, match=r"--weights .*1 missing key\(s\).*layer1.0.conv1.weight"):
        build_extractor("grid-tiny", str(path), SMALL)


def test_grid_refuses_a_grid_outside_the_box_limits():
    with pytest.raises(ValueError, match="grid 12×12 gives 144 regions"):
        build_extractor("grid-tiny", None, ExtractSettings(grid=12))


def test_pixels_are_what_the_soho_reader_decodes():
    from vlp.datasets.stream.data_config import PixelConfig
    from vlp.datasets.stream.pixels import decode_resize
    ext = build_extractor("pixels", None, SMALL)
    yy, xx = np.mgrid[0:100, 0:150]          # smooth, like a photograph (noise is JPEG's worst)
    im = np.stack([xx * 255 // 149, yy * 255 // 99, (xx + yy) * 255 // 248], -1).astype(np.uint8)
    (out,) = _run(ext, [im])
    blob = out["pixels"].tobytes()
    with Image.open(io.BytesIO(blob)) as stored:
        assert stored.format == "JPEG" and stored.size == (96, 64)   # short side 64
    assert out["boxes"].tolist() == [[0, 0, 150, 100]]
    got = decode_resize(blob, PixelConfig(shorter_side=64, longer_max=128))
    assert got.shape == (64, 96, 3)
    ref = np.asarray(Image.fromarray(im).resize((96, 64), Image.BILINEAR), np.float32)
    assert np.abs(got.astype(np.float32) - ref).mean() < 2     # JPEG q95


def _images(folder, n=3):
    folder.mkdir()
    for i in range(n):
        Image.fromarray(_rgb(40, 60, i)).save(folder / f"COCO_val2014_{i + 1:012d}.jpg")
    return folder


def test_check_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    from vlp.cli import main
    imgs = _images(tmp_path / "imgs")
    out = tmp_path / "world"
    assert main(["data", "extract", "--images", str(imgs), "--model", "grid-tiny",
                 "--source", "coco", "--out", str(out), "--grid", "4", "--short-side", "64",
                 "--long-side", "96", "--check"]) == 0
    assert "3 images to extract" in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.parametrize("extra, expected", [
    (["--model", "nope"], "unknown extractor; known: butd-r101-c4"),
    (["--model", "grid-tiny", "--weights", "missing.pt"], "--weights missing.pt: no such file"),
    (["--model", "grid-tiny", "--min-boxes", "0"], "min_boxes=0"),
    (["--model", "grid-tiny", "--source", "../x"], "cannot be used as a file name"),
])
def test_bad_options_are_one_line_before_anything_runs(tmp_path, capsys, extra, expected):
    from vlp.cli import main
    imgs = _images(tmp_path / "imgs")
    args = ["data", "extract", "--images", str(imgs), "--source", "coco",
            "--out", str(tmp_path / "w")] + extra
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1
    assert not (tmp_path / "w").exists()


def test_two_files_with_one_image_id_are_refused(tmp_path, capsys):
    from vlp.cli import main
    imgs = _images(tmp_path / "imgs")
    Image.fromarray(_rgb(40, 60)).save(imgs / "COCO_train2014_000000000001.png")
    assert main(["data", "extract", "--images", str(imgs), "--model", "grid-tiny", "--source",
                 "coco", "--out", str(tmp_path / "w"), "--check"]) == 2
    assert "same image id '1'" in capsys.readouterr().err


def test_images_by_uri_are_listed_and_decoded_from_object_storage(s3_env, tmp_path):
    """An s3:// folder: listed (hidden names and non-images skipped) and read by the decode
    stage through pyarrow.fs, with the endpoint from the standard AWS environment."""
    from vlp.platform.extract.decode_stage import PrepareImages
    from vlp.platform.extract.image_sources import image_refs, images_in
    imgs = _images(tmp_path / "imgs", n=2)
    (imgs / "readme.txt").write_text("not an image")
    (imgs / "truncated.jpg").write_bytes((imgs / "COCO_val2014_000000000001.jpg").read_bytes()[:99])
    s3_env.create_bucket("extract-images")
    uri = s3_env.upload(imgs, "extract-images/coco")
    refs = image_refs(images_in(uri), uri)
    assert [r.image_id for r in refs] == ["1", "2", "truncated"]
    assert refs[0].location == f"{uri}/COCO_val2014_000000000001.jpg"
    out = PrepareImages("grid-tiny", SMALL)({"image_id": np.array([r.image_id for r in refs]),
                                             "location": np.array([r.location for r in refs])})
    # resized, still uint8 HWC (normalised on the model's device)
    assert out["input"][0].shape == (64, 96, 3) and out["input"][0].dtype == np.uint8
    assert out["height"].tolist()[:2] == [40, 40]
    assert out["error"].tolist() == ["", "", "truncated at byte 99 (the header ends early)"]
