"""Scenes: a few objects with class, colour, size and material on a canvas, and the spatial
relations between them. Pure data + sampling; no pixels, no features, no text."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from vlp.datasets.synth.vocabulary import (CLASSES, COLOUR_NAMES, COLOURS, MATERIALS, SIZE_NAMES,
                                           SIZES)

ATTRIBUTES = ("size", "colour", "material")   # English adjective order before the noun
# glyph width / height; the longer side is the size word's span
ASPECT = {"egg": 0.75, "arrow": 1.35, "tree": 0.8, "flag": 1.1, "bell": 0.9, "cup": 1.1}


@dataclass(frozen=True)
class DomainStyle:
    """How one source's pictures look. In-domain sources (coco, vg, downstream) share one
    style; the out-of-domain web sources (cc, sbu) get busier, differently lit pictures, as
    alt-text images differ from COCO's."""
    min_objects: int
    max_objects: int
    backgrounds: tuple[tuple[float, float, float], ...]
    textured_background: float     # probability of a striped/checkered background
    lighting_sigma: float           # per-image global colour cast
    class_skew: float               # Zipf exponent of class frequencies (long tail)
    class_offset: int               # which classes are the frequent ones in this domain
    size_probs: tuple[float, float, float]


IN_DOMAIN = DomainStyle(2, 5, ((0.80, 0.80, 0.78), (0.72, 0.76, 0.80), (0.82, 0.78, 0.70)),
                        0.0, 0.04, 0.6, 0, (0.3, 0.4, 0.3))
OUT_OF_DOMAIN = DomainStyle(1, 6, ((0.68, 0.80, 0.72), (0.85, 0.85, 0.90), (0.75, 0.70, 0.78),
                                   (0.62, 0.66, 0.70)),
                            0.5, 0.08, 0.9, 5, (0.4, 0.35, 0.25))


@dataclass
class SceneObject:
    cls: int          # index into CLASSES (detector class cls + 1)
    colour: int       # index into COLOUR_NAMES
    size: int         # index into SIZE_NAMES
    material: int     # index into MATERIALS
    box: np.ndarray   # float32 (4,) x1, y1, x2, y2 in pixels

    @property
    def noun(self) -> str:
        return CLASSES[self.cls]

    def attr(self, name: str) -> str:
        return {"colour": COLOUR_NAMES[self.colour], "size": SIZE_NAMES[self.size],
                "material": MATERIALS[self.material], "noun": CLASSES[self.cls]}[name]

    @property
    def center(self) -> tuple[float, float]:
        return (float(self.box[0] + self.box[2]) / 2, float(self.box[1] + self.box[3]) / 2)

    def record(self) -> dict:
        return {"class": self.noun, "colour": self.attr("colour"), "size": self.attr("size"),
                "material": self.attr("material"),
                "box": [round(float(v), 2) for v in self.box]}


@dataclass
class Scene:
    image_id: str
    canvas: int
    background: tuple[float, float, float]
    texture: str                 # "plain" | "stripes" | "checker"
    lighting: np.ndarray         # (3,) additive colour cast
    objects: list[SceneObject] = field(default_factory=list)

    def matching(self, desc: dict[str, str]) -> list[int]:
        """Indices of objects that fit a description {attribute or 'noun': word}."""
        return [i for i, o in enumerate(self.objects)
                if all(o.attr(k) == v for k, v in desc.items())]

    def count(self, **desc: str) -> int:
        return len(self.matching(desc))


def class_weights(style: DomainStyle) -> np.ndarray:
    ranks = (np.arange(len(CLASSES)) - style.class_offset) % len(CLASSES)
    w = 1.0 / (ranks + 2.0) ** style.class_skew
    return w / w.sum()


def sample_scene(rng: np.random.Generator, image_id: str, canvas: int,
                 style: DomainStyle) -> Scene:
    bg = np.array(style.backgrounds[rng.integers(len(style.backgrounds))])
    bg = np.clip(bg + rng.normal(0, 0.03, 3), 0, 1)
    texture = "plain"
    if rng.random() < style.textured_background:
        texture = ("stripes", "checker")[rng.integers(2)]
    scene = Scene(image_id, canvas, tuple(float(v) for v in bg), texture,
                  rng.normal(0, style.lighting_sigma, 3))
    n = int(rng.integers(style.min_objects, style.max_objects + 1))
    cw = class_weights(style)
    for _ in range(n):
        cls = int(rng.choice(len(CLASSES), p=cw))
        size = int(rng.choice(3, p=style.size_probs))
        box = _place(rng, scene, CLASSES[cls], SIZES[SIZE_NAMES[size]])
        if box is None:
            continue  # no room left: a sparser picture, as in real data
        scene.objects.append(SceneObject(cls, int(rng.integers(len(COLOURS))), size,
                                         int(rng.integers(len(MATERIALS))), box))
    if not scene.objects:  # the smallest object always fits an empty canvas
        side = SIZES["small"] * canvas
        x, y = rng.uniform(1, canvas - side - 1, 2)
        scene.objects.append(SceneObject(0, int(rng.integers(len(COLOURS))), 0,
                                         int(rng.integers(len(MATERIALS))),
                                         np.array([x, y, x + side, y + side], np.float32)))
    return scene


def _place(rng: np.random.Generator, scene: Scene, noun: str, frac: float
           ) -> np.ndarray | None:
    s = scene.canvas
    side = frac * s * rng.uniform(0.9, 1.1)
    a = ASPECT.get(noun, 1.0)
    w, h = (side, side / a) if a >= 1 else (side * a, side)
    for _ in range(30):
        x = rng.uniform(1, s - w - 1)
        y = rng.uniform(1, s - h - 1)
        box = np.array([x, y, x + w, y + h], np.float32)
        # keep objects apart enough to be seen and named: small overlap only
        if all(_overlap_frac(box, o.box) < 0.08 for o in scene.objects):
            return box
    return None


def _overlap_frac(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return float(iw * ih / smaller)


# --------------------------------------------------------------------------- relations

def relations(scene: Scene, a: int, b: int) -> set[str]:
    """Canonical relations that clearly hold for 'object a <rel> object b'. Diagonal or
    borderline placements get no directional relation, so that text about them is never
    ambiguous."""
    oa, ob = scene.objects[a], scene.objects[b]
    (ax, ay), (bx, by) = oa.center, ob.center
    dx, dy = bx - ax, by - ay
    margin = 0.12 * scene.canvas
    out: set[str] = set()
    if abs(dx) > margin and abs(dx) > 1.3 * abs(dy):
        out.add("left" if dx > 0 else "right")
    if abs(dy) > margin and abs(dy) > 1.3 * abs(dx):
        out.add("above" if dy > 0 else "below")
    gx = max(0.0, float(max(ob.box[0] - oa.box[2], oa.box[0] - ob.box[2])))
    gy = max(0.0, float(max(ob.box[1] - oa.box[3], oa.box[1] - ob.box[3])))
    if np.hypot(gx, gy) < 0.12 * scene.canvas:
        out.add("next")
    return out


def relation_pairs(scene: Scene) -> list[tuple[int, int, str]]:
    """Every (a, b, rel) that holds, a ≠ b."""
    return [(a, b, r) for a, b in itertools.permutations(range(len(scene.objects)), 2)
            for r in sorted(relations(scene, a, b))]


# --------------------------------------------------------------------------- descriptions

def phrase(obj: SceneObject, attrs: tuple[str, ...] | list[str], noun: str | None = None
           ) -> str:
    """'small red wooden box' with the given attributes, in English adjective order."""
    words = [obj.attr(a) for a in ATTRIBUTES if a in attrs]
    return " ".join(words + [noun or obj.noun])


def unique_attrs(scene: Scene, i: int, rng: np.random.Generator,
                 allowed: tuple[str, ...] = ATTRIBUTES) -> tuple[str, ...] | None:
    """A smallest attribute set (from ``allowed``) that, with the noun, picks out object i
    alone (ties broken at random); None when identical twins make that impossible."""
    obj = scene.objects[i]
    order = [a for a in ATTRIBUTES if a in allowed]
    rng.shuffle(order)
    for k in range(len(order) + 1):
        for attrs in itertools.combinations(order, k):
            desc = {a: obj.attr(a) for a in attrs} | {"noun": obj.noun}
            if scene.matching(desc) == [i]:
                return attrs
    return None


def random_attrs(rng: np.random.Generator, p: dict[str, float] | None = None
                 ) -> tuple[str, ...]:
    """A random subset of attributes to mention (colour most often, as people do)."""
    p = p or {"size": 0.35, "colour": 0.8, "material": 0.35}
    return tuple(a for a in ATTRIBUTES if rng.random() < p[a])
