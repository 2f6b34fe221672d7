"""One image file → HWC uint8 RGB, or one line saying what is wrong with the file.

What real collections hold (COCO, VG, Conceptual Captions) and what each becomes:

- grayscale, 1-bit, CMYK (Adobe's inverted CMYK included: PIL undoes it), YCbCr: converted to
  RGB; 16-bit grayscale (PNG ``I;16``/``I``): scaled to 8 bits (÷257), not clipped (PIL's
  own conversion clips every value over 255 to white); 16-bit RGB PNGs PIL already reads as
  8-bit RGB;
- palette, palette with transparency, LA, RGBA: composited onto white (a transparent pixel's
  colour is undefined, and photos with alpha are mostly cut-outs meant for a white page);
- EXIF orientation applied (the rotated pixels are what the shard's width and height say);
- reported, one line each: an empty file, a file no image format recognises, a truncated
  file, one with more than ``MAX_PIXELS`` pixels (a decompression bomb: a few KB of PNG can
  declare billions of pixels), one with a side under ``MIN_SIDE`` pixels (icons and tracking
  pixels: resized to 600 px they give no regions worth storing), and a file that cannot be
  read (permissions, gone since the listing).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from vlp.contract.uri_files import read_bytes

MAX_PIXELS = 100_000_000      # 100 MP: 10 000 × 10 000; the largest COCO/VG/CC images are < 20 MP
MIN_SIDE = 32


class BadImage(ValueError):
    """What is wrong with one image file (the report's reason, one line)."""


def read_image(location: str) -> np.ndarray:
    """The file at ``location`` (a path or URI) as HWC uint8 RGB; ``BadImage`` otherwise."""
    try:
        blob = read_bytes(location)
    except PermissionError:
        raise BadImage("cannot read: permission denied") from None
    except FileNotFoundError:
        raise BadImage("cannot read: no such file (gone since the listing)") from None
    except OSError as e:
        raise BadImage(f"cannot read: {' '.join(str(e).split())[:200]}") from None
    return decode_rgb(blob)


def _open(blob: bytes) -> Image.Image:
    """``Image.open`` with PIL's own bomb check off (ours runs on the declared size, with a
    stated limit and the file's own numbers in the message)."""
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(blob))
    finally:
        Image.MAX_IMAGE_PIXELS = limit


def decode_rgb(blob: bytes) -> np.ndarray:
    """Encoded bytes → HWC uint8 RGB, EXIF orientation applied; ``BadImage`` with the reason.
    ``load()`` decodes the whole file here, so a truncated file fails here and not later."""
    if not blob:
        raise BadImage("empty (0 bytes)")
    try:
        im = _open(blob)
    except UnidentifiedImageError:
        raise BadImage(f"not an image ({len(blob)} bytes; no image format starts with "
                       f"{blob[:12]!r})") from None
    except (OSError, SyntaxError, ValueError) as e:
        message = " ".join(str(e).split())
        if "truncat" in message.lower():
            raise BadImage(f"truncated at byte {len(blob)} (the header ends early)") from None
        raise BadImage(f"corrupt header ({message[:150]})") from None
    with im:
        w, h = im.size
        what = f"{im.format or 'image'} {w}×{h}"
        if w * h > MAX_PIXELS:
            raise BadImage(f"too large: {w * h} pixels over the limit {MAX_PIXELS} "
                           f"({what}; a decompression-bomb guard)")
        if min(w, h) < MIN_SIDE:
            raise BadImage(f"too small: {what} (sides under {MIN_SIDE} pixels are not "
                           f"extracted)")
        try:
            im.load()
        except (OSError, SyntaxError, ValueError) as e:
            message = " ".join(str(e).split())
            if "truncat" in message.lower() or "broken" in message.lower():
                raise BadImage(f"truncated at byte {len(blob)} ({what} whose data ends "
                               f"early)") from None
            raise BadImage(f"corrupt {what} ({message[:150]})") from None
        try:
            im = ImageOps.exif_transpose(im)
        except Exception:   # an unreadable EXIF block: the pixels as stored
            pass
        return _rgb(im)


def _rgb(im: Image.Image) -> np.ndarray:
    if im.mode == "RGB":
        return np.asarray(im, dtype=np.uint8)
    if im.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        gray = np.asarray(im).astype(np.float32)
        gray = np.clip(np.rint(gray / 257.0), 0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if im.mode == "F":
        gray = np.clip(np.rint(np.asarray(im, dtype=np.float32)), 0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if im.mode in ("RGBA", "LA", "PA", "La", "RGBa") or (
            im.mode == "P" and "transparency" in im.info):
        rgba = im.convert("RGBA")
        page = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.asarray(Image.alpha_composite(page, rgba).convert("RGB"), dtype=np.uint8)
    return np.asarray(im.convert("RGB"), dtype=np.uint8)
