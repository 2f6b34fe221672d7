"""Scenes → PNG pixels, for the end-to-end (SOHO) path that learns from images directly.

Each class has its own glyph, each material its own texture (metal: shiny gradient, wooden:
grain stripes, plastic: flat, glass: translucent with an outline), so that everything the
captions name is visible in the pixels too.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageDraw

from vlp.datasets.synth.scene import Scene, SceneObject
from vlp.datasets.synth.vocabulary import COLOURS, COLOUR_NAMES, MATERIALS


def _poly(d: ImageDraw.ImageDraw, w: float, h: float, pts) -> None:
    d.polygon([(x * (w - 1), y * (h - 1)) for x, y in pts], fill=255)


def _ellipse(d, w, h, x0, y0, x1, y1, fill=255) -> None:
    d.ellipse([x0 * (w - 1), y0 * (h - 1), x1 * (w - 1), y1 * (h - 1)], fill=fill)


def _star(points: int, inner: float):
    out = []
    for k in range(2 * points):
        r = 0.5 if k % 2 == 0 else 0.5 * inner
        t = -math.pi / 2 + k * math.pi / points
        out.append((0.5 + r * math.cos(t), 0.5 + r * math.sin(t)))
    return out


def _ring(d, w, h):
    _ellipse(d, w, h, 0, 0, 1, 1)
    _ellipse(d, w, h, 0.3, 0.3, 0.7, 0.7, fill=0)


def _heart(d, w, h):
    _ellipse(d, w, h, 0.0, 0.05, 0.55, 0.55)
    _ellipse(d, w, h, 0.45, 0.05, 1.0, 0.55)
    _poly(d, w, h, [(0.03, 0.38), (0.97, 0.38), (0.5, 1.0)])


def _moon(d, w, h):
    _ellipse(d, w, h, 0, 0, 1, 1)
    _ellipse(d, w, h, 0.35, -0.05, 1.25, 0.85, fill=0)


def _house(d, w, h):
    _poly(d, w, h, [(0.5, 0.0), (1.0, 0.45), (0.0, 0.45)])
    _poly(d, w, h, [(0.12, 0.45), (0.88, 0.45), (0.88, 1.0), (0.12, 1.0)])


def _tree(d, w, h):
    _poly(d, w, h, [(0.5, 0.0), (1.0, 0.75), (0.0, 0.75)])
    _poly(d, w, h, [(0.4, 0.7), (0.6, 0.7), (0.6, 1.0), (0.4, 1.0)])


def _cup(d, w, h):
    _poly(d, w, h, [(0.0, 0.1), (0.75, 0.1), (0.65, 1.0), (0.1, 1.0)])
    _ellipse(d, w, h, 0.6, 0.25, 1.0, 0.7)
    _ellipse(d, w, h, 0.72, 0.37, 0.88, 0.58, fill=0)


def _flag(d, w, h):
    _poly(d, w, h, [(0.0, 0.0), (0.12, 0.0), (0.12, 1.0), (0.0, 1.0)])
    _poly(d, w, h, [(0.12, 0.0), (1.0, 0.0), (0.8, 0.3), (1.0, 0.6), (0.12, 0.6)])


def _bell(d, w, h):
    _poly(d, w, h, [(0.3, 0.05), (0.7, 0.05), (0.85, 0.75), (1.0, 0.85), (0.0, 0.85),
                    (0.15, 0.75)])
    _ellipse(d, w, h, 0.4, 0.78, 0.6, 1.0)


GLYPHS = {
    "ball": lambda d, w, h: _ellipse(d, w, h, 0, 0, 1, 1),
    "egg": lambda d, w, h: _ellipse(d, w, h, 0, 0, 1, 1),
    "box": lambda d, w, h: _poly(d, w, h, [(0.05, 0.05), (0.95, 0.05), (0.95, 0.95),
                                           (0.05, 0.95)]),
    "cone": lambda d, w, h: _poly(d, w, h, [(0.5, 0.0), (1.0, 1.0), (0.0, 1.0)]),
    "ring": _ring,
    "star": lambda d, w, h: _poly(d, w, h, _star(5, 0.45)),
    "cross": lambda d, w, h: _poly(d, w, h, [(0.33, 0), (0.67, 0), (0.67, 0.33), (1, 0.33),
                                             (1, 0.67), (0.67, 0.67), (0.67, 1), (0.33, 1),
                                             (0.33, 0.67), (0, 0.67), (0, 0.33),
                                             (0.33, 0.33)]),
    "diamond": lambda d, w, h: _poly(d, w, h, [(0.5, 0), (1, 0.5), (0.5, 1), (0, 0.5)]),
    "heart": _heart,
    "moon": _moon,
    "arrow": lambda d, w, h: _poly(d, w, h, [(0, 0.35), (0.55, 0.35), (0.55, 0.05), (1, 0.5),
                                             (0.55, 0.95), (0.55, 0.65), (0, 0.65)]),
    "house": _house,
    "tree": _tree,
    "cup": _cup,
    "flag": _flag,
    "bell": _bell,
}


def _background(scene: Scene) -> np.ndarray:
    s = scene.canvas
    img = np.empty((s, s, 3), np.float32)
    img[:] = scene.background
    if scene.texture == "stripes":
        img[::6] *= 0.88
        img[1::6] *= 0.88
    elif scene.texture == "checker":
        yy, xx = np.mgrid[0:s, 0:s]
        img[((yy // 8) + (xx // 8)) % 2 == 1] *= 0.9
    return img


def _texture(obj: SceneObject, h: int, w: int, lighting: np.ndarray) -> tuple[np.ndarray, float]:
    rgb = np.clip(np.array(COLOURS[COLOUR_NAMES[obj.colour]]) + lighting, 0, 1)
    tex = np.empty((h, w, 3), np.float32)
    tex[:] = rgb
    material = MATERIALS[obj.material]
    alpha = 1.0
    if material == "metal":  # a highlight toward the top-left, shade toward the bottom-right
        yy, xx = np.mgrid[0:h, 0:w]
        g = 1.0 - (xx / max(w, 1) + yy / max(h, 1)) / 2        # 1 at top-left, 0 at bottom-right
        tex = np.clip(tex * (0.7 + 0.5 * g[..., None]) + 0.25 * (g[..., None] ** 4), 0, 1)
    elif material == "wooden":
        tex[1::3] *= 0.72
    elif material == "glass":
        alpha = 0.5
    return tex, alpha


def render_scene(scene: Scene) -> np.ndarray:
    """The scene as an (S, S, 3) uint8 array."""
    img = _background(scene)
    for obj in scene.objects:
        x0, y0 = int(math.floor(obj.box[0])), int(math.floor(obj.box[1]))
        x1, y1 = int(math.ceil(obj.box[2])), int(math.ceil(obj.box[3]))
        w, h = x1 - x0, y1 - y0
        mask_img = Image.new("L", (w, h), 0)
        GLYPHS[obj.noun](ImageDraw.Draw(mask_img), w, h)
        mask = np.asarray(mask_img, np.float32) / 255.0
        tex, alpha = _texture(obj, h, w, scene.lighting)
        m = (mask * alpha)[..., None]
        region = img[y0:y1, x0:x1]
        region[:] = region * (1 - m) + tex * m
        if MATERIALS[obj.material] == "glass":  # the rim of a glass object stays visible
            edge = np.asarray(_edges(mask_img), np.float32) / 255.0
            region[:] = region * (1 - 0.6 * edge[..., None]) + tex * 0.6 * edge[..., None]
    return (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)


def _edges(mask_img: Image.Image) -> Image.Image:
    from PIL import ImageFilter
    return mask_img.filter(ImageFilter.FIND_EDGES)


def encode_png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG", compress_level=6)
    return buf.getvalue()
