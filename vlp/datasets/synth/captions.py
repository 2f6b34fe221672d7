"""Pretraining text in UNITER's four styles.

- coco: ~5 full sentences per image naming objects, attributes and relations (in-domain).
- vg:   dense region phrases, many per image ("red ball", "ball left of box") (in-domain).
- cc:   one alt-text per image: boilerplate prefixes, hypernyms ("toy", "thing"), vaguer
        colours, and a share of captions unrelated to the picture (out-of-domain).
- sbu:  one user-written line per image: first person, chatty endings, also some unrelated.

Unrelated captions are returned flagged so the world records them: a later curation feature
measures precision/recall of removing exactly those pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vlp.datasets.synth.scene import (Scene, phrase, random_attrs, relation_pairs, sample_scene,
                                      IN_DOMAIN)
from vlp.datasets.synth.vocabulary import (CC_PREFIXES, HYPERNYMS, NUMBER_WORDS, PLURALS, RELATIONS,
                                           SBU_ENDINGS, SBU_OPENERS, UNRELATED_TEXT, VAGUE_COLOURS,
                                           MATERIAL_ANSWERS, with_article)


@dataclass(frozen=True)
class Caption:
    text: str
    unrelated: str | None = None   # None, or why it does not describe its image


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(len(seq)))]


def _np(scene: Scene, i: int, rng: np.random.Generator, noun: str | None = None) -> str:
    return with_article(phrase(scene.objects[i], random_attrs(rng), noun))


def _rel_form(rng: np.random.Generator, rel: str) -> str:
    return _pick(rng, RELATIONS[rel])


# --------------------------------------------------------------------------- coco

def coco_sentence(scene: Scene, rng: np.random.Generator) -> str:
    objs = len(scene.objects)
    pairs = relation_pairs(scene)
    kind = int(rng.integers(5))
    if kind <= 1 and pairs:
        a, b, rel = _pick(rng, pairs)
        form = _rel_form(rng, rel)
        return _pick(rng, (
            f"{_np(scene, a, rng)} {form} {_np(scene, b, rng)}",
            f"{_np(scene, a, rng)} is {form} the {phrase(scene.objects[b], random_attrs(rng))}",
            f"there is {_np(scene, a, rng)} {form} {_np(scene, b, rng)}",
            f"{_np(scene, a, rng)} sitting {form} {_np(scene, b, rng)}",
        )) + "."
    if kind == 2 and objs >= 2:
        idx = rng.permutation(objs)[:min(objs, 3)]
        parts = [_np(scene, int(i), rng) for i in idx]
        listed = ", ".join(parts[:-1]) + " and " + parts[-1]
        return _pick(rng, (f"{listed}.", f"a picture of {listed}.",
                           f"{NUMBER_WORDS[objs]} objects including {parts[0]}."))
    if kind == 3:
        nouns = [o.noun for o in scene.objects]
        noun = _pick(rng, sorted(set(nouns)))
        k = nouns.count(noun)
        if k >= 2:
            return f"{NUMBER_WORDS[k]} {PLURALS[noun]} on a plain background."
    i = int(rng.integers(objs))
    o = scene.objects[i]
    return _pick(rng, (f"a close up of {_np(scene, i, rng)}.",
                       f"{with_article(phrase(o, ('colour',)))} made of "
                       f"{MATERIAL_ANSWERS[o.attr('material')]}.",
                       f"{_np(scene, i, rng)} among {NUMBER_WORDS[objs]} objects."))


def coco_captions(scene: Scene, rng: np.random.Generator, n: int = 5) -> list[Caption]:
    out: list[str] = []
    for _ in range(4 * n):  # distinct sentences, as five annotators write five
        s = coco_sentence(scene, rng)
        if s not in out:
            out.append(s)
        if len(out) == n:
            break
    return [Caption(s) for s in out]


# --------------------------------------------------------------------------- vg

def vg_phrases(scene: Scene, rng: np.random.Generator) -> list[Caption]:
    out: list[str] = []
    for o in scene.objects:
        attrs = random_attrs(rng) or ("colour",)
        out.append(phrase(o, attrs))
        if rng.random() < 0.4:
            a = _pick(rng, ("colour", "size", "material"))
            word = MATERIAL_ANSWERS[o.attr(a)] if a == "material" else o.attr(a)
            out.append(f"the {o.noun} is {'made of ' if a == 'material' else ''}{word}")
    pairs = relation_pairs(scene)
    for k in rng.permutation(len(pairs))[:3]:
        a, b, rel = pairs[int(k)]
        attrs = random_attrs(rng, {"size": 0.1, "colour": 0.5, "material": 0.1})
        out.append(f"{phrase(scene.objects[a], attrs)} {_rel_form(rng, rel)} "
                   f"{scene.objects[b].noun}")
    return [Caption(s) for s in dict.fromkeys(out)]


# --------------------------------------------------------------------------- cc / sbu

def _unrelated(rng: np.random.Generator, canvas: int, image_id: str) -> Caption:
    if rng.random() < 0.5:
        return Caption(_pick(rng, UNRELATED_TEXT), "web_text")
    other = sample_scene(rng, image_id + "-other", canvas, IN_DOMAIN)  # another picture's text
    return Caption(coco_sentence(other, rng).rstrip("."), "other_image")


def _web_np(scene: Scene, i: int, rng: np.random.Generator) -> str:
    o = scene.objects[i]
    noun = _pick(rng, HYPERNYMS) if rng.random() < 0.45 else None
    attrs = random_attrs(rng)
    text = phrase(o, attrs, noun)
    if "colour" in attrs and rng.random() < 0.2:
        text = text.replace(o.attr("colour"), _pick(rng, VAGUE_COLOURS), 1)
    return text


def cc_caption(scene: Scene, rng: np.random.Generator, unrelated_rate: float = 0.12
               ) -> Caption:
    if rng.random() < unrelated_rate:
        return _unrelated(rng, scene.canvas, scene.image_id)
    prefix = _pick(rng, CC_PREFIXES)
    pairs = relation_pairs(scene)
    r = rng.random()
    if r < 0.35 and pairs:
        a, b, rel = _pick(rng, pairs)
        body = f"{with_article(_web_np(scene, a, rng))} {_rel_form(rng, rel)} " \
               f"{with_article(_web_np(scene, b, rng))}"
    elif r < 0.55 and len(scene.objects) >= 2:
        body = f"{_pick(rng, VAGUE_COLOURS)} {_pick(rng, HYPERNYMS)}s on a " \
               f"{'patterned' if scene.texture != 'plain' else 'plain'} background"
    else:
        body = with_article(_web_np(scene, int(rng.integers(len(scene.objects))), rng))
        if rng.random() < 0.3:
            body += " isolated on a background"
    return Caption((prefix + body).strip())


def sbu_caption(scene: Scene, rng: np.random.Generator, unrelated_rate: float = 0.15
                ) -> Caption:
    if rng.random() < unrelated_rate:
        return _unrelated(rng, scene.canvas, scene.image_id)
    i = int(rng.integers(len(scene.objects)))
    body = _web_np(scene, i, rng)
    pairs = [p for p in relation_pairs(scene) if p[0] == i]
    if pairs and rng.random() < 0.4:
        _, b, rel = _pick(rng, pairs)
        body += f" {_rel_form(rng, rel)} the {scene.objects[b].noun}"
    return Caption(f"{_pick(rng, SBU_OPENERS)}{body}{_pick(rng, SBU_ENDINGS)}")
