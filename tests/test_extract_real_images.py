"""What real collections hold, through `vlp data extract`: every mode PIL reads converted
(grayscale, palette, RGBA, CMYK, 16-bit, EXIF-rotated), every broken file one line of the
report saying what is wrong with it, the other images' shards complete, exit status 3."""

from __future__ import annotations

import io
import os
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from vlp.platform.extract.image_files import MAX_PIXELS, BadImage, decode_rgb

GRID = ["--model", "grid-tiny", "--grid", "4", "--short-side", "64", "--long-side", "96",
        "--batch-size", "3", "--workers", "1"]


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    small = (rng.random((4, 5, 3)) * 255).astype(np.uint8)
    return np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC))


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    return buf.getvalue()


def _png_declaring(width: int, height: int) -> bytes:
    """A 60-byte PNG whose header declares width × height 1-bit pixels (a decompression bomb's
    shape: what it would inflate to is in the header, the data is a few bytes)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 16)) + chunk(b"IEND", b""))


def _exif_rotated(rgb: np.ndarray) -> bytes:
    im = Image.fromarray(rgb)
    exif = im.getexif()
    exif[0x0112] = 6          # orientation: rotate 90° clockwise to display
    return _encode(im, "JPEG", exif=exif.tobytes(), quality=92)


def _collection(folder) -> dict[str, bytes]:
    """file name → bytes: the good images of every mode, then the broken files."""
    rgb = _photo(48, 72, 0)
    gray16 = (np.linspace(0, 65535, 50 * 70).reshape(50, 70)).astype(np.uint16)
    palette = Image.fromarray(_photo(52, 64, 2)).quantize(16)
    palette.info["transparency"] = 0
    rgba = np.dstack([_photo(40, 66, 3), np.full((40, 66), 128, np.uint8)])
    good = {
        "COCO_val2014_000000000001.jpg": _encode(Image.fromarray(rgb), "JPEG", quality=92),
        "gray.jpg": _encode(Image.fromarray(rgb[:, :, 0]), "JPEG"),
        "palette.png": _encode(palette, "PNG", transparency=0),
        "alpha.png": _encode(Image.fromarray(rgba, "RGBA"), "PNG"),
        "cmyk.jpg": _encode(Image.fromarray(rgb).convert("CMYK"), "JPEG"),
        "depth16.png": _encode(Image.fromarray(gray16), "PNG"),
        "rotated.jpg": _exif_rotated(_photo(40, 80, 5)),
    }
    whole = good["COCO_val2014_000000000001.jpg"]
    bad = {
        "empty.jpg": b"",
        "truncated.jpg": whole[: len(whole) // 2],
        "readme.jpg": b"these photos were taken in 2014 by ...\n",
        "tiny.png": _encode(Image.fromarray(_photo(12, 20, 6)), "PNG"),
        "bomb.png": _png_declaring(20_000, 20_000),
    }
    folder.mkdir()
    for name, blob in {**good, **bad}.items():
        (folder / name).write_bytes(blob)
    return good


def test_each_mode_converts_to_rgb_as_documented():
    gray16 = np.array([[0, 32896, 65535, 257]], np.uint16).repeat(40, 0).repeat(10, 1)
    out = decode_rgb(_encode(Image.fromarray(gray16), "PNG"))
    assert out.dtype == np.uint8 and out.shape == (40, 40, 3)
    np.testing.assert_array_equal(out[0, ::10, 0], [0, 128, 255, 1])   # scaled, not clipped
    clear = np.zeros((40, 40, 4), np.uint8)                             # fully transparent
    assert (decode_rgb(_encode(Image.fromarray(clear, "RGBA"), "PNG")) == 255).all()
    rotated = decode_rgb(_exif_rotated(_photo(40, 80, 5)))
    assert rotated.shape == (80, 40, 3)
    red = np.zeros((40, 40, 3), np.uint8)
    red[..., 0] = 200
    cmyk = decode_rgb(_encode(Image.fromarray(red).convert("CMYK"), "JPEG", quality=95))
    assert abs(int(cmyk[20, 20, 0]) - 200) < 8 and cmyk[20, 20, 1:].max() < 12


@pytest.mark.parametrize("blob,reason", [
    (b"", "empty (0 bytes)"),
    (b"hello", "not an image (5 bytes"),
    (_png_declaring(20_000, 20_000), f"too large: 400000000 pixels over the limit {MAX_PIXELS}"),
    (_encode(Image.fromarray(_photo(12, 40, 1)), "PNG"), "too small: PNG 40×12"),
])
def test_broken_files_say_what_is_wrong(blob, reason):
    with pytest.raises(BadImage) as e:
        decode_rgb(blob)
    assert str(e.value).startswith(reason) and "\n" not in str(e.value)


def test_truncated_jpeg_names_the_byte_it_ends_at():
    whole = _encode(Image.fromarray(_photo(64, 96, 2)), "JPEG", quality=95)
    cut = whole[: len(whole) // 2]
    with pytest.raises(BadImage, match=rf"^truncated at byte {len(cut)} \(JPEG 96×64"):
        decode_rgb(cut)


def test_unreadable_file_is_one_line(tmp_path, monkeypatch):
    from vlp.platform.extract import image_files

    def denied(where):
        raise PermissionError(13, "Permission denied", str(where))
    monkeypatch.setattr(image_files, "read_bytes", denied)
    with pytest.raises(BadImage, match=r"^cannot read: permission denied$"):
        image_files.read_image(str(tmp_path / "x.jpg"))


def test_a_real_collection_through_the_job(ray_local, tmp_path, capsys):
    from vlp.cli import main
    from vlp.datasets.storage.shards import list_shards, read_image_shard

    imgs, out = tmp_path / "imgs", tmp_path / "world"
    good = _collection(imgs)
    listing = sorted(str(p) for p in imgs.iterdir()) + [str(imgs / "gone.jpg")]
    unreadable = imgs / "locked.jpg"
    if os.geteuid() != 0:     # root reads any file: the unit test above covers it there
        unreadable.write_bytes(good["gray.jpg"])
        unreadable.chmod(0)
        listing.append(str(unreadable))
    (tmp_path / "list.txt").write_text("\n".join(listing) + "\n")
    code = main(["data", "extract", "--image-list", str(tmp_path / "list.txt"),
                 "--source", "web", "--out", str(out), "--images-per-shard", "4"] + GRID)
    captured = capsys.readouterr()
    assert code == 3, captured.err
    failed = dict(ln[len("extract: failed: "):].split(": ", 1)
                  for ln in captured.err.splitlines() if ln.startswith("extract: failed: "))
    whole = good["COCO_val2014_000000000001.jpg"]
    expected = {
        "empty.jpg": "empty (0 bytes)",
        "truncated.jpg": f"truncated at byte {len(whole) // 2} (JPEG 72×48",
        "readme.jpg": "not an image (",
        "tiny.png": "too small: PNG 20×12",
        "bomb.png": f"too large: 400000000 pixels over the limit {MAX_PIXELS}",
        "gone.jpg": "cannot read: no such file",
    }
    if os.geteuid() != 0:
        expected["locked.jpg"] = "cannot read: permission denied"
    assert {os.path.basename(k) for k in failed} == set(expected), captured.err
    for path, reason in failed.items():
        assert reason.startswith(expected[os.path.basename(path)]), (path, reason)
    assert f"{len(good)} images written" in captured.out
    assert f"{len(expected)} failed" in captured.out

    rows = {}
    for f in list_shards(out / "images" / "web"):
        table, _ = read_image_shard(f)
        rows.update({r["image_id"]: r for r in table.to_pylist()})
    assert set(rows) == {"1", "gray", "palette", "alpha", "cmyk", "depth16", "rotated"}
    assert (rows["rotated"]["width"], rows["rotated"]["height"]) == (40, 80)   # EXIF applied
    assert (rows["depth16"]["width"], rows["depth16"]["height"]) == (70, 50)
    assert main(["data", "validate", str(out)]) == 0
