"""VQA: questions about colour, count, existence, relations, material and size, each with ten
annotator answers that disagree the way VQA v2 annotators do (look-alike colours, off-by-one
counts, flipped yes/no, synonyms), so the VQA soft score (min(#agree / 3, 1)) is not trivial.
"""

from __future__ import annotations

import numpy as np

from vlp.datasets.synth.facts import a_desc, absent_desc, desc_of, desc_text, only_satisfier
from vlp.datasets.synth.scene import Scene, random_attrs, relation_pairs, unique_attrs
from vlp.datasets.synth.vocabulary import (CLASSES, COLOUR_NAMES, COLOUR_SLIPS, CONFUSABLE,
                                           MATERIAL_ANSWERS, OPPOSITE, PLURALS, RELATIONS,
                                           SIZE_NAMES)

ANNOTATORS = 10
# how often an annotator gives the canonical answer, by question type (then jittered per
# question, so some questions get near-unanimous answers and some split)
ACCURACY = {"colour": 0.88, "count": 0.78, "yesno": 0.9, "noun": 0.85, "material": 0.8,
            "size": 0.72}
QUESTION_TYPES = ("colour", "count", "exist", "relation_yesno", "relation_what", "material",
                  "size")
TYPE_WEIGHTS = np.array([0.2, 0.2, 0.18, 0.15, 0.1, 0.1, 0.07])


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _slip(kind: str, answer: str, rng: np.random.Generator) -> str:
    if kind == "colour":
        return _pick(rng, COLOUR_SLIPS[answer])
    if kind == "count":
        return str(max(0, int(answer) + (1 if rng.random() < 0.5 else -1)))
    if kind == "yesno":
        return "no" if answer == "yes" else "yes"
    if kind == "noun":
        return CONFUSABLE[answer] if answer in CONFUSABLE and rng.random() < 0.7 else "toy"
    if kind == "material":
        return _pick(rng, [m for m in MATERIAL_ANSWERS.values() if m != answer])
    if kind == "size":
        i = SIZE_NAMES.index(answer)
        return SIZE_NAMES[1] if i != 1 else _pick(rng, ("small", "large"))
    raise ValueError(kind)


def annotate(kind: str, answer: str, rng: np.random.Generator) -> list[str]:
    p = float(np.clip(ACCURACY[kind] + rng.normal(0, 0.08), 0.45, 0.99))
    return [answer if rng.random() < p else _slip(kind, answer, rng) for _ in range(ANNOTATORS)]


def _unique_without(scene: Scene, i: int, rng, attr: str):
    allowed = tuple(a for a in ("size", "colour", "material") if a != attr)
    attrs = unique_attrs(scene, i, rng, allowed=allowed)
    return None if attrs is None else desc_of(scene, i, attrs)


def question(scene: Scene, rng: np.random.Generator) -> tuple[str, str, str] | None:
    """(question, canonical answer, answer kind), or None when this draw fits no question."""
    qtype = QUESTION_TYPES[int(rng.choice(len(QUESTION_TYPES), p=TYPE_WEIGHTS))]
    i = int(rng.integers(len(scene.objects)))
    o = scene.objects[i]
    if qtype in ("colour", "material", "size"):
        d = _unique_without(scene, i, rng, qtype)
        if d is None:
            return None
        if qtype == "colour":
            return f"what color is the {desc_text(d)}?", o.attr("colour"), "colour"
        if qtype == "material":
            return (f"what is the {desc_text(d)} made of?",
                    MATERIAL_ANSWERS[o.attr("material")], "material")
        return f"what size is the {desc_text(d)}?", o.attr("size"), "size"
    if qtype == "count":
        r = rng.random()
        if r < 0.5:
            noun = o.noun if rng.random() < 0.8 else _pick(rng, CLASSES)
            return (f"how many {PLURALS[noun]} are there?", str(scene.count(noun=noun)),
                    "count")
        if r < 0.8:
            c = o.attr("colour") if rng.random() < 0.8 else _pick(rng, COLOUR_NAMES)
            return f"how many {c} objects are there?", str(scene.count(colour=c)), "count"
        return "how many objects are there?", str(len(scene.objects)), "count"
    if qtype == "exist":
        present = desc_of(scene, i, random_attrs(rng))
        d = present if rng.random() < 0.5 else absent_desc(scene, rng, like=present)
        return f"is there {a_desc(d)}?", "yes" if scene.matching(d) else "no", "yesno"
    pairs = relation_pairs(scene)
    pairs = [p for p in pairs if p[2] != "next"]
    if not pairs:
        return None
    a, b, rel = _pick(rng, pairs)
    db = _unique_without(scene, b, rng, "")
    if db is None:
        return None
    if qtype == "relation_what":
        if only_satisfier(scene, rel, b) is None:
            return None
        return (f"what is {_pick(rng, RELATIONS[rel])} the {desc_text(db)}?",
                scene.objects[a].noun, "noun")
    da = _unique_without(scene, a, rng, "")
    if da is None:
        return None
    yes = rng.random() < 0.5
    asked = rel if yes else OPPOSITE[rel]
    return (f"is the {desc_text(da)} {_pick(rng, RELATIONS[asked])} the {desc_text(db)}?",
            "yes" if yes else "no", "yesno")


def vqa_items(scene: Scene, rng: np.random.Generator, n: int) -> list[tuple[str, list[str]]]:
    out: dict[str, list[str]] = {}
    for _ in range(10 * n):
        q = question(scene, rng)
        if q is not None and q[0] not in out:
            out[q[0]] = annotate(q[2], q[1], rng)
        if len(out) == n:
            break
    return list(out.items())
