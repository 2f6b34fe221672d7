"""Grounded downstream items: RefCOCO+ expressions and VCR-style multiple choice.

RefCOCO+ expressions name appearance only (colour, size, material, noun), never location:
an object gets an expression only when its appearance alone singles it out, sometimes
over-specified with one extra attribute as people do.

VCR items ask which object stands in a relation to another (or its colour); the right
rationale states the relation, the wrong ones state false relations or other objects.
"""

from __future__ import annotations

import numpy as np

from vlp.datasets.synth.facts import absent_desc, desc_of, desc_text, only_satisfier
from vlp.datasets.synth.scene import ATTRIBUTES, Scene, relation_pairs, unique_attrs
from vlp.datasets.synth.vocabulary import COLOUR_NAMES, OPPOSITE, RELATIONS


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def referring_expressions(scene: Scene, rng: np.random.Generator, n: int
                          ) -> list[tuple[str, int]]:
    out = []
    for i in rng.permutation(len(scene.objects)):
        attrs = unique_attrs(scene, int(i), rng)
        if attrs is None:
            continue
        spare = [a for a in ATTRIBUTES if a not in attrs]
        if spare and rng.random() < 0.3:
            attrs = attrs + (_pick(rng, spare),)
        text = desc_text(desc_of(scene, int(i), attrs))
        out.append((text if rng.random() < 0.5 else f"the {text}", int(i)))
        if len(out) == n:
            break
    return out


def _choices(correct: str, wrong: list[str], rng: np.random.Generator
             ) -> tuple[list[str], int] | None:
    wrong = [w for w in dict.fromkeys(wrong) if w != correct][:3]
    if len(wrong) < 3:
        return None
    order = rng.permutation(4)
    items = [correct] + wrong
    return [items[k] for k in order], int(np.flatnonzero(order == 0)[0])


def vcr_item(scene: Scene, rng: np.random.Generator):
    """(question, answers, answer_label, rationales, rationale_label) or None."""
    pairs = [(a, b, r) for a, b, r in relation_pairs(scene)
             if r != "next" and only_satisfier(scene, r, b) == a]
    if not pairs:
        return None
    a, b, rel = _pick(rng, pairs)
    attrs_a, attrs_b = unique_attrs(scene, a, rng), unique_attrs(scene, b, rng)
    if attrs_a is None or attrs_b is None:
        return None
    da, db = desc_of(scene, a, attrs_a), desc_of(scene, b, attrs_b)
    form, opposite = _pick(rng, RELATIONS[rel]), _pick(rng, RELATIONS[OPPOSITE[rel]])
    others = [desc_of(scene, k, ("colour",)) for k in range(len(scene.objects))
              if k not in (a, b)]
    # a decoy must not also describe the right object, or a "wrong" choice would be true
    decoys = [d for d in others + [absent_desc(scene, rng) for _ in range(4)]
              if a not in scene.matching(d)]
    rng.shuffle(decoys)
    if rng.random() < 0.5:
        question = f"what is {form} the {desc_text(db)}?"
        answers = _choices(f"the {desc_text(da)}.",
                           [f"the {desc_text(d)}." for d in decoys], rng)
        right = f"the {desc_text(da)} is {form} the {desc_text(db)}."
    else:
        colour = scene.objects[a].attr("colour")
        question = f"what color is the thing {form} the {desc_text(db)}?"
        answers = _choices(f"it is {colour}.",
                           [f"it is {c}." for c in rng.permutation(COLOUR_NAMES)], rng)
        right = f"the {colour} {da['noun']} is {form} the {desc_text(db)}."
    wrong = [f"the {desc_text(da)} is {opposite} the {desc_text(db)}.",
             *[f"the {desc_text(d)} is {form} the {desc_text(db)}." for d in decoys],
             f"the {desc_text(db)} is {form} the {desc_text(da)}."]
    rationales = _choices(right, wrong, rng)
    if answers is None or rationales is None:
        return None
    return question, answers[0], answers[1], rationales[0], rationales[1]
