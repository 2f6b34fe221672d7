"""True/false statements about images: NLVR2 (one statement about two images) and SNLI-VE
(a hypothesis that the image entails, contradicts, or leaves open).

Labels are drawn first (balanced) and a statement is sampled until its computed truth matches,
so label frequencies carry no signal; NLVR2 negatives are mostly near misses of true
statements (a wrong colour, a wrong count, the other image).
"""

from __future__ import annotations

import numpy as np

from vlp.datasets.synth.facts import (a_desc, absent_desc, count_phrase, desc_of, desc_text,
                                      holds)
from vlp.datasets.synth.scene import Scene, random_attrs, relation_pairs, unique_attrs
from vlp.datasets.synth.vocabulary import (COLOUR_NAMES, NUMBER_WORDS, OPPOSITE, PLURALS,
                                           RELATIONS, UNVERIFIABLE)

SIDES = ("left", "right")


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _some_desc(scenes: list[Scene], rng: np.random.Generator) -> dict:
    s = scenes[int(rng.integers(len(scenes)))]
    d = desc_of(s, int(rng.integers(len(s.objects))), random_attrs(rng))
    return absent_desc(s, rng, like=d) if rng.random() < 0.3 else d


# --------------------------------------------------------------------------- NLVR2

def nlvr2_candidate(left: Scene, right: Scene, rng: np.random.Generator) -> tuple[str, bool]:
    pair = {"left": left, "right": right}
    kind = int(rng.integers(6))
    side = _pick(rng, SIDES)
    scene = pair[side]
    if kind == 0:
        d = _some_desc([left, right], rng)
        return f"the {side} image contains {a_desc(d)}.", bool(scene.matching(d))
    if kind == 1:
        noun = _pick(rng, [o.noun for o in left.objects + right.objects])
        true_n = scene.count(noun=noun)
        n = int(np.clip(true_n + _pick(rng, (0, 0, -1, 1)), 0, len(NUMBER_WORDS) - 1))
        return (f"the {side} image contains exactly {count_phrase(n, noun)}.", n == true_n)
    if kind == 2:
        d = _some_desc([left, right], rng)
        return (f"both images contain {a_desc(d)}.",
                bool(left.matching(d)) and bool(right.matching(d)))
    if kind == 3:
        d = _some_desc([left, right], rng)
        return (f"exactly one image contains {a_desc(d)}.",
                bool(left.matching(d)) != bool(right.matching(d)))
    if kind == 4:
        noun = _pick(rng, [o.noun for o in left.objects + right.objects])
        return (f"there are more {PLURALS[noun]} in the left image than in the right image.",
                left.count(noun=noun) > right.count(noun=noun))
    pairs = [p for p in relation_pairs(scene) if p[2] != "next"]
    if not pairs:
        return f"the {side} image contains {count_phrase(len(scene.objects), 'object')}.", True
    a, b, rel = _pick(rng, pairs)
    da = desc_of(scene, a, random_attrs(rng, {"size": 0.1, "colour": 0.7, "material": 0.1}))
    db = desc_of(scene, b, random_attrs(rng, {"size": 0.1, "colour": 0.5, "material": 0.1}))
    if rng.random() < 0.5:
        rel = OPPOSITE[rel]
    return (f"in the {side} image, {a_desc(da)} is {_pick(rng, RELATIONS[rel])} "
            f"{a_desc(db)}.", holds(scene, da, rel, db))


def nlvr2_statement(left: Scene, right: Scene, rng: np.random.Generator, label: bool
                    ) -> str | None:
    for _ in range(40):
        text, truth = nlvr2_candidate(left, right, rng)
        if truth == label:
            return text
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
