"""True/false statements about images: NLVR2 (one statement about two images) and SNLI-VE
(a hypothesis that the image entails, contradicts, or leaves open).

Labels are drawn first (balanced) and a statement is sampled until its computed truth matches,
so label frequencies carry no signal; NLVR2 negatives are mostly near misses of true
statements (a wrong colour, a wrong count, the other image).
"""

from __future__ import annotations

import numpy as np

from vlp.datasets.synth.facts import a_desc, absent_desc, count_phrase, desc_of, desc_text, holds
from vlp.datasets.synth.scene import Scene, random_attrs, relation_pairs, unique_attrs
from vlp.datasets.synth.vocabulary import COLOUR_NAMES, OPPOSITE, PLURALS, RELATIONS, UNVERIFIABLE

SIDES = ("left", "right")


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


# --------------------------------------------------------------------------- NLVR2

NLVR2_KINDS = ("contains", "exactly", "both", "one", "more", "relation")
ATTR_COUNT_P = (0.4, 0.45, 0.15)   # how many attributes a description carries


def _descs(scenes: list[Scene], attrs: tuple[str, ...]) -> list[dict]:
    """Descriptions (with exactly ``attrs``) of every object in the given scenes."""
    return [dict(t) for t in dict.fromkeys(
        tuple(sorted(desc_of(s, i, attrs).items())) for s in scenes
        for i in range(len(s.objects)))]


def nlvr2_candidates(kind: str, left: Scene, right: Scene, attrs: tuple[str, ...],
                     rng: np.random.Generator) -> list[tuple[str, bool]]:
    """Every statement of one kind (and description shape) about the pair, with its truth."""
    pair = {"left": left, "right": right}
    descs = _descs([left, right], attrs)
    out = []
    if kind == "contains":
        out = [(f"the {side} image contains {a_desc(d)}.", bool(pair[side].matching(d)))
               for side in SIDES for d in descs]
    elif kind == "exactly":
        n = int(rng.integers(1, 4))   # the number is drawn first, so it says nothing alone
        out = [(f"the {side} image contains exactly {count_phrase(n, d['noun'])}.",
                len(pair[side].matching(d)) == n) for side in SIDES for d in descs]
    elif kind == "both":
        out = [(f"both images contain {a_desc(d)}.",
                bool(left.matching(d)) and bool(right.matching(d))) for d in descs]
    elif kind == "one":
        out = [(f"exactly one image contains {a_desc(d)}.",
                bool(left.matching(d)) != bool(right.matching(d))) for d in descs]
    elif kind == "more":
        a, b = ("left", "right") if rng.random() < 0.5 else ("right", "left")
        out = [(f"there are more {PLURALS[d['noun']]} in the {a} image than in the {b} "
                f"image.", pair[a].count(noun=d["noun"]) > pair[b].count(noun=d["noun"]))
               for d in _descs([left, right], ())]
    elif kind == "relation":
        for side in SIDES:
            s = pair[side]
            for i, j, rel in relation_pairs(s):
                if rel == "next":
                    continue
                da, db = desc_of(s, i, attrs), desc_of(s, j, ())
                for r in (rel, OPPOSITE[rel]):  # the flipped relation is the near miss
                    out.append((f"in the {side} image, {a_desc(da)} is "
                                f"{_pick(rng, RELATIONS[r])} {a_desc(db)}.", holds(s, da, r, db)))
    return out


def nlvr2_item(scenes: list[Scene], rng: np.random.Generator, label: bool
               ) -> tuple[int, int, str] | None:
    """(left index, right index, statement) with the given truth value.

    The kind of statement and the shape of its description are drawn before the images, and
    image pairs are redrawn until the pair admits a statement with the wanted label: so the
    text alone (kind, number, attribute count) says nothing about the label, as NLVR2's
    balanced collection intends.
    """
    kind = NLVR2_KINDS[int(rng.integers(len(NLVR2_KINDS)))]
    n_attrs = int(rng.choice(3, p=ATTR_COUNT_P))
    attrs = tuple(sorted(rng.choice(["size", "colour", "material"], n_attrs, replace=False)))
    for _ in range(40):
        i, j = (int(v) for v in rng.choice(len(scenes), 2, replace=False))
        hits = [t for t, truth in nlvr2_candidates(kind, scenes[i], scenes[j], attrs, rng)
                if truth == label]
        if hits:
            return i, j, _pick(rng, hits)
    return None


# --------------------------------------------------------------------------- SNLI-VE

def _ve_fact(scene: Scene, rng: np.random.Generator, true: bool) -> str | None:
    kind = int(rng.integers(4))
    i = int(rng.integers(len(scene.objects)))
    o = scene.objects[i]
    if kind == 0:
        d = desc_of(scene, i, random_attrs(rng))
        if not true:
            d = absent_desc(scene, rng, like=d)
        return f"there is {a_desc(d)} in the picture."
    if kind == 1:
        attrs = unique_attrs(scene, i, rng, allowed=("size", "material"))
        if attrs is None:
            return None
        colour = o.attr("colour") if true else _pick(
            rng, [c for c in COLOUR_NAMES if c != o.attr("colour")])
        return f"the {desc_text(desc_of(scene, i, attrs))} is {colour}."
    if kind == 2:
        pairs = [p for p in relation_pairs(scene) if p[2] != "next"]
        if not pairs:
            return None
        a, b, rel = _pick(rng, pairs)
        da = desc_of(scene, a, random_attrs(rng))
        db = desc_of(scene, b, random_attrs(rng))
        if not true:
            rel = OPPOSITE[rel]
        if holds(scene, da, rel, db) != true:
            return None
        return f"{a_desc(da)} is {_pick(rng, RELATIONS[rel])} {a_desc(db)}."
    n = scene.count(noun=o.noun)
    if not true:
        n = max(0, n + _pick(rng, (-1, 1, 2)))
        if n == scene.count(noun=o.noun):
            return None
    return f"the picture shows {count_phrase(n, o.noun)}."


def ve_hypothesis(scene: Scene, rng: np.random.Generator, label: str) -> str | None:
    """A hypothesis with the given label: entailment = a true visible fact, contradiction = a
    false visible fact, neutral = a predicate no picture can settle, about an object that is
    there (so a model must still ground the object)."""
    for _ in range(30):
        if label == "neutral":
            i = int(rng.integers(len(scene.objects)))
            attrs = unique_attrs(scene, i, rng)
            if attrs is None:
                continue
            return f"the {desc_text(desc_of(scene, i, attrs))} {_pick(rng, UNVERIFIABLE)}."
        text = _ve_fact(scene, rng, label == "entailment")
        if text is not None:
            return text
    return None
