"""Each curation filter on hand-made pairs (no shards, no model)."""

from __future__ import annotations

import numpy as np
import pytest

from vlp.platform.curation import FILTERS, CurationConfig, CurationConfigError, run_filters
from vlp.platform.curation.caption_clean import clean_caption
from vlp.platform.curation.pairs import PairTable
from vlp.platform.curation.registry import CurationContext
from vlp.platform.curation.text_frequency import normalise_text
from vlp.datasets.stream.text_tokenizer import load_tokenizer


def pairs_of(images) -> PairTable:
    """images: (image_id, width, height, content, [captions])."""
    t = PairTable(files=[])
    for i, (iid, w, h, content, caps) in enumerate(images):
        t.image_id.append(iid)
        t.split.append("train")
        t.content.append(content)
        for j, c in enumerate(caps):
            t.image = np.append(t.image, i)
            t.caption_index = np.append(t.caption_index, j)
            t.original.append(c)
    t.width = np.array([im[1] for im in images])
    t.height = np.array([im[2] for im in images])
    t.image_file = np.zeros(len(images), np.int64)
    t.image_row = np.arange(len(images))
    t.text = list(t.original)
    t.itm_score = np.full(t.num_pairs, np.nan)
    t.quality = np.ones(t.num_pairs)
    return t


def apply(name, pairs, cfg=CurationConfig(), scorer=None):
    ctx = CurationContext(tokenizer=load_tokenizer(None), scorer=scorer)
    return FILTERS[name](pairs, np.ones(pairs.num_pairs, bool), cfg, ctx)


def test_registry_order_follows_imagebert():
    assert list(FILTERS) == ["image_size", "clean", "length", "vocabulary", "text_frequency",
                             "itm", "aggregate"]


def test_image_size():
    p = pairs_of([("a", 400, 300, "x", ["ok"]), ("b", 1000, 100, "y", ["banner"]),
                  ("c", 200, 250, "z", ["small"])])
    assert apply("image_size", p).tolist() == [False, True, False]
    assert apply("image_size", p, CurationConfig(min_side=300)).tolist() == [False, True, True]
    assert not apply("image_size", p, CurationConfig(max_aspect_ratio=0)).any()


def test_caption_cleaning():
    assert clean_caption("A&nbsp;dog &amp; a <b>cat</b>\n\tplaying") == "A dog & a cat playing"
    assert clean_caption("see https://x.com/a.jpg or www.y.org now") == "see or now"
    assert clean_caption("&lt;img src=x&gt;red\u200bball mail me@host.com") == "red ball mail"
    p = pairs_of([("a", 9, 9, "x", ["  <p>a red ball</p> ", "<br/> http://x.y "])])
    assert apply("clean", p).tolist() == [False, True]
    assert p.text[0] == "a red ball" and p.original[0] == "  <p>a red ball</p> "


def test_length():
    p = pairs_of([("a", 9, 9, "x", ["ball", "a red ball", " ".join(["w"] * 41)])])
    assert apply("length", p).tolist() == [True, False, True]
    assert apply("length", p, CurationConfig(min_words=1, max_words=0)).tolist() == [
        False, False, False]


def test_vocabulary():
    p = pairs_of([("a", 9, 9, "x", ["a red ball next to a box.", "dsc00123 ff7a9b2c qwzx",
                                    "🙂🙂 🙂", "my kaleidoscope photo from the trip"])])
    assert apply("vocabulary", p).tolist() == [False, True, True, False]
    # the in-vocabulary share is what aggregation ranks texts by without a model
    assert p.quality[0] == 1.0 and p.quality[1] == 0.0 and 0.5 < p.quality[3] < 1.0
    strict = CurationConfig(max_oov_ratio=0.1)
    assert apply("vocabulary", p, strict).tolist() == [False, True, True, True]


def test_one_text_on_too_many_images():
    boiler = "Click here to read more!"
    images = [(f"i{k}", 9, 9, f"c{k}", [boiler if k < 4 else f"a ball number {k}"])
              for k in range(6)]
    images.append(("dup", 9, 9, "c0", ["click here to read more"]))   # a copy of image i0
    p = pairs_of(images)
    assert normalise_text(" Click  here to read more! ") == "click here to read more"
    assert apply("text_frequency", p, CurationConfig(max_images_per_text=4)).sum() == 0
    assert apply("text_frequency", p, CurationConfig(max_images_per_text=3)).tolist() == [
        True] * 4 + [False] * 2 + [True]


def test_best_texts_per_picture():
    # one picture under two ids (same content hash), three texts in all
    p = pairs_of([("a", 9, 9, "same", ["a ball", "xqzv wrtl"]), ("b", 9, 9, "same",
                                                                  ["a red ball"]),
                  ("c", 9, 9, "other", ["a box", "a blue box"])])
    p.quality[:] = [0.9, 0.2, 1.0, 0.5, 0.5]
    assert apply("aggregate", p).tolist() == [True, True, False, False, True]
    p.itm_score[:] = [0.95, 0.1, 0.3, 0.2, 0.8]          # scores outrank quality
    assert apply("aggregate", p).tolist() == [False, True, True, True, False]
    assert apply("aggregate", p, CurationConfig(max_texts_per_image=2)).tolist() == [
        False, True, False, False, False]


class FixedScorer:
    def __init__(self, scores):
        self.scores = np.asarray(scores, float)

    def score(self, pairs, which):
        return self.scores[which]


def test_itm_filter_scores_and_removes():
    p = pairs_of([("a", 9, 9, "x", ["a ball", "a box"]), ("b", 9, 9, "y", ["a cup"])])
    assert not FILTERS["itm"].active(CurationConfig(), CurationContext())
    cfg = CurationConfig(min_itm_score=0.5)
    assert apply("itm", p, cfg, FixedScorer([0.9, 0.2, 0.5])).tolist() == [False, True, False]
    assert p.itm_score.tolist() == [0.9, 0.2, 0.5]
    # without a threshold the scores still rank one picture's texts in aggregation
    assert not apply("itm", p, CurationConfig(), FixedScorer([0.1, 0.2, 0.3])).any()


def test_run_filters_charges_the_first_filter():
    p = pairs_of([("a", 1000, 10, "x", ["<b></b>"]), ("b", 90, 90, "y", ["ok"]),
                  ("c", 90, 90, "z", ["a red ball", "a blue ball"])])
    ctx = CurationContext(tokenizer=load_tokenizer(None))
    removed, ran = run_filters(p, CurationConfig(), ctx)
    assert removed.tolist() == ["image_size", "length", "", "aggregate"]
    assert ran == ["image_size", "clean", "length", "vocabulary", "text_frequency",
                   "aggregate"]
    removed, ran = run_filters(pairs_of([("a", 9, 9, "x", ["ok"])]), CurationConfig(), ctx,
                               ["length"])
    assert ran == ["length"] and removed.tolist() == ["length"]
    with pytest.raises(ValueError, match="unknown curation filter"):
        run_filters(p, CurationConfig(), ctx, ["lenght"])


def test_config_is_checked():
    with pytest.raises(CurationConfigError, match="max_oov_ratio"):
        CurationConfig(max_oov_ratio=1.5)
    with pytest.raises(CurationConfigError, match="min_itm_score"):
        CurationConfig(min_itm_score=-0.1)
    with pytest.raises(CurationConfigError, match="max_words 2 < min_words 3"):
        CurationConfig(min_words=3, max_words=2)
