"""Checkable facts about scenes: descriptions, what is absent, counts and relations.

The downstream generators (VQA, NLVR2, SNLI-VE, VCR) build their text from these, so a
statement's truth is always computed from the scene, never assumed.
"""

from __future__ import annotations

import numpy as np

from vlp.datasets.synth.scene import ATTRIBUTES, Scene, relations
from vlp.datasets.synth.vocabulary import (CLASSES, COLOUR_NAMES, MATERIALS, NUMBER_WORDS, PLURALS,
                                           SIZE_NAMES, with_article)

VALUES = {"noun": CLASSES, "colour": COLOUR_NAMES, "size": SIZE_NAMES, "material": MATERIALS}

Desc = dict  # {"noun": "ball", "colour": "red", ...}; a subset of attributes plus the noun


def desc_text(desc: Desc) -> str:
    words = [desc[a] for a in ATTRIBUTES if a in desc]
    return " ".join(words + [desc.get("noun", "object")])


def a_desc(desc: Desc) -> str:
    return with_article(desc_text(desc))


def desc_of(scene: Scene, i: int, attrs) -> Desc:
    o = scene.objects[i]
    return {a: o.attr(a) for a in attrs} | {"noun": o.noun}


def absent_desc(scene: Scene, rng: np.random.Generator, like: Desc | None = None) -> Desc:
    """A description that matches nothing in the scene; when ``like`` is given, it differs
    from it in one word (a near miss, the hard kind of negative)."""
    for _ in range(50):
        if like is not None:
            d = dict(like)
            key = list(d)[int(rng.integers(len(d)))]
            d[key] = VALUES[key][int(rng.integers(len(VALUES[key])))]
        else:
            d = {"noun": CLASSES[int(rng.integers(len(CLASSES)))]}
            if rng.random() < 0.6:
                d["colour"] = COLOUR_NAMES[int(rng.integers(len(COLOUR_NAMES)))]
        if not scene.matching(d):
            return d
    return {"noun": next(c for c in CLASSES if not scene.matching({"noun": c}))} \
        if len({o.noun for o in scene.objects}) < len(CLASSES) else {"noun": "dog"}


def count_phrase(n: int, noun: str) -> str:
    return f"{NUMBER_WORDS[n]} {noun if n == 1 else PLURALS.get(noun, noun + 's')}"


def holds(scene: Scene, da: Desc, rel: str, db: Desc) -> bool:
    """Some object fitting da is <rel> some object fitting db."""
    return any(rel in relations(scene, a, b) for a in scene.matching(da)
               for b in scene.matching(db) if a != b)


def only_satisfier(scene: Scene, rel: str, b: int) -> int | None:
    """The single object that is <rel> object b, or None when zero or several are."""
    hits = [a for a in range(len(scene.objects)) if a != b and rel in relations(scene, a, b)]
    return hits[0] if len(hits) == 1 else None
