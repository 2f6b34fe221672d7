"""Masking policies: statistics over many samples, and the rules that must never break."""

from __future__ import annotations

import numpy as np
import pytest

from vlp.contract import batch_spec as K
from vlp.tasks import TASKS, MaskContext, apply_masking
from vlp.tasks.masking_visual import SOFT_LABELS
from vlp.datasets.batching.task_batch import whole_image_feature
from vlp.datasets.stream.text_tokenizer import load_tokenizer

PAD, CLS, SEP, MASK = 0, 101, 102, 103


@pytest.fixture(scope="module")
def ctx():
    tok = load_tokenizer()
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id) == (PAD, CLS, SEP, MASK)
    return MaskContext(0.15, MASK, CLS, SEP, tok.random_ids)


def text_batch(rng, B=3000, words=(30, 48)):
    """[CLS] w… [SEP] [PAD]…; word ids never special."""
    lens = rng.integers(words[0], words[1] + 1, B)
    T = lens.max() + 2
    ids = np.full((B, T), PAD, np.int64)
    ids[:, 0] = CLS
    pos = np.arange(T)[None, :]
    words_mask = (pos >= 1) & (pos <= lens[:, None])
    ids[words_mask] = rng.integers(2000, 29000, words_mask.sum())
    ids[np.arange(B), lens + 1] = SEP
    mask = (pos < (lens + 2)[:, None]).astype(np.int64)
    return {K.INPUT_IDS: ids, K.TEXT_MASK: mask, K.POSITIVE: np.ones(B, bool)}


def region_batch(rng, B=3000, N=(20, 36), D=8, C=6):
    n = rng.integers(N[0], N[1] + 1, B)
    Nmax = n.max()
    rmask = (np.arange(Nmax)[None, :] < n[:, None]).astype(np.int64)
    feats = rng.normal(size=(B, Nmax, D)).astype(np.float32) * rmask[..., None]
    soft = rng.dirichlet(np.ones(C), (B, Nmax)).astype(np.float32)
    return {K.REGION_FEATS: feats, K.REGION_LOC: np.zeros((B, Nmax, 7), np.float32),
            K.REGION_MASK: rmask, SOFT_LABELS: soft}


def full_batch(rng, **kw):
    b = text_batch(rng, **kw)
    b.update(region_batch(rng, B=len(b[K.POSITIVE])))
    return b


def test_mlm_rate_and_80_10_10(ctx):
    rng = np.random.default_rng(0)
    b = text_batch(rng)
    orig = b[K.INPUT_IDS].copy()
    apply_masking("mlm", b, rng, ctx, "conditional", "regions")
    labels = b[K.MLM_LABELS]
    chosen = labels != -100
    words = (b[K.TEXT_MASK] == 1) & (orig != CLS) & (orig != SEP)
    rate = chosen.sum() / words.sum()
    assert abs(rate - 0.15) < 0.01, rate
    assert (labels[chosen] == orig[chosen]).all()
    new = b[K.INPUT_IDS][chosen]
    share_mask = (new == MASK).mean()
    share_same = (new == orig[chosen]).mean()
    share_random = 1 - share_mask - share_same
    assert abs(share_mask - 0.8) < 0.015 and abs(share_same - 0.1) < 0.015 \
        and abs(share_random - 0.1) < 0.015, (share_mask, share_same, share_random)
    # unmasked positions untouched
    assert (b[K.INPUT_IDS][~chosen] == orig[~chosen]).all()


def test_mlm_never_special_or_padding_and_at_least_one(ctx):
    rng = np.random.default_rng(1)
    b = text_batch(rng, B=4000, words=(1, 6))   # short texts: the at-least-one rule matters
    orig = b[K.INPUT_IDS].copy()
    apply_masking("mlm", b, rng, ctx, "conditional", "regions")
    chosen = b[K.MLM_LABELS] != -100
    assert not chosen[(orig == CLS) | (orig == SEP) | (b[K.TEXT_MASK] == 0)].any()
    assert (b[K.INPUT_IDS][b[K.TEXT_MASK] == 0] == PAD).all()
    assert chosen.any(axis=1).all()
    random_drawn = b[K.INPUT_IDS][chosen & (b[K.INPUT_IDS] != orig) & (b[K.INPUT_IDS] != MASK)]
    assert not np.isin(random_drawn, [PAD, CLS, SEP, MASK, 100]).any()


@pytest.mark.parametrize("task", ["mrfr", "mrc", "mrc-kl", "moc", "mrc-vlbert"])
def test_region_tasks_rate_targets_and_padding(ctx, task):
    rng = np.random.default_rng(2)
    b = full_batch(rng)
    feats, soft = b[K.REGION_FEATS].copy(), b[SOFT_LABELS].copy()
    apply_masking(task, b, rng, ctx, "conditional", "regions")
    masked, zeroed, real = b[K.REGION_MASKED], b[K.REGION_ZEROED], b[K.REGION_MASK] == 1
    assert abs(masked.sum() / real.sum() - 0.15) < 0.01
    assert not masked[~real].any() and masked.any(axis=1).all()
    assert (b[K.REGION_FEATS][zeroed] == 0).all()
    assert (b[K.REGION_FEATS][~zeroed] == feats[~zeroed]).all()
    assert K.MLM_LABELS not in b and (b[K.INPUT_IDS] != MASK).all()   # text untouched
    if task == "moc":   # 90% of masked zeroed, 10% kept
        assert abs(zeroed.sum() / masked.sum() - 0.9) < 0.02 and not (zeroed & ~masked).any()
    else:
        assert (zeroed == masked).all()
    if task == "mrfr":
        assert np.array_equal(b[K.REGION_FEAT_TARGETS], feats)
    if task in ("mrc", "moc", "mrc-vlbert"):
        labels = b[K.REGION_CLASS_LABELS]
        assert (labels[~masked] == -100).all()
        expect = soft[..., 1:].argmax(-1) + 1    # background (0) excluded
        assert (labels[masked] == expect[masked]).all() and (labels[masked] >= 1).all()
    if task in ("mrc-kl", "mrc-vlbert"):   # VL-BERT's reference: the detector's distribution
        assert np.array_equal(b[K.REGION_SOFT_LABELS], soft)


def test_background_never_a_hard_label(ctx):
    rng = np.random.default_rng(3)
    b = full_batch(rng, B=200)
    b[SOFT_LABELS][..., 0] = 0.99   # background dominates every region
    apply_masking("mrc", b, rng, ctx, "conditional", "regions")
    assert (b[K.REGION_CLASS_LABELS][b[K.REGION_MASKED]] >= 1).all()


def test_vlbert_whole_image_feature_is_the_images_whatever_the_masking(ctx):
    """Without a stored whole-image RoI: the mean of the image's real regions, taken before
    masking (the pipeline's order), so a masked RoI does not change it (issue 29)."""
    rng = np.random.default_rng(4)
    b = full_batch(rng, B=50)
    feats = b[K.REGION_FEATS].copy()
    img = whole_image_feature(b)
    apply_masking("mrc-vlbert", b, rng, ctx, "conditional", "regions")
    assert b[K.REGION_ZEROED].any()
    real = b[K.REGION_MASK] == 1
    for i in range(50):
        assert np.allclose(img[i], feats[i][real[i]].mean(0), atol=1e-5)


TEXT, ZEROED, MASKED = K.MLM_LABELS, K.REGION_ZEROED, K.REGION_MASKED
# the masking keys each task writes, by mode (UNITER §3.1: MLM masks words, the MRM tasks
# regions, conditionally one modality; "joint" masks both; ITM masks nothing)
MASK_KEYS = {
    ("mlm", "conditional"): {TEXT}, ("mlm", "joint"): {TEXT, ZEROED},
    **{(t, "conditional"): {ZEROED, MASKED} for t in ("mrfr", "mrc", "mrc-kl", "moc")},
    **{(t, "joint"): {TEXT, ZEROED, MASKED} for t in ("mrfr", "mrc", "mrc-kl", "moc")},
    ("itm", "conditional"): set(), ("itm", "joint"): set(),
}


def test_each_task_writes_its_masking_keys(ctx):
    rng = np.random.default_rng(4)
    for (task, mode), keys in MASK_KEYS.items():
        b = full_batch(rng, B=50)
        apply_masking(task, b, rng, ctx, mode, "regions")
        assert {k for k in (TEXT, ZEROED, MASKED) if k in b} == keys, (task, mode)


def test_conditional_masks_one_modality_joint_both(ctx):
    rng = np.random.default_rng(5)
    for task, mode in [("mlm", "conditional"), ("mrfr", "conditional"), ("mrc-kl", "conditional"),
                       ("itm", "conditional"), ("itm", "joint")]:
        b = full_batch(rng, B=500)
        apply_masking(task, b, rng, ctx, mode, "regions")
        keys = MASK_KEYS[task, mode]
        text = (b[TEXT] != -100).any(axis=1) if TEXT in keys else np.zeros(500, bool)
        regions = ((b[ZEROED] | b[MASKED]).any(axis=1) if ZEROED in keys
                   else np.zeros(500, bool))
        assert not (text & regions).any(), (task, mode)   # never both in one example
        if task != "itm":   # and the one it masks is masked in every example
            assert (text | regions).all(), (task, mode)
    for task in ("mlm", "mrfr", "moc"):
        b = full_batch(rng, B=500)
        apply_masking(task, b, rng, ctx, "joint", "regions")
        text = (b[TEXT] != -100).any(axis=1)
        regions = (b[ZEROED] | b.get(MASKED, False)).any(axis=1)   # MLM joint: zeroed only
        assert (text & regions).all(), task   # MOC may keep a masked region's feature


def test_masking_only_on_positive_pairs(ctx):
    rng = np.random.default_rng(6)
    for task in ("mlm", "mrfr", "mrc", "moc"):
        for mode in ("conditional", "joint"):
            b = full_batch(rng, B=400)
            b[K.POSITIVE][::2] = False
            apply_masking(task, b, rng, ctx, mode, "regions")
            neg, keys = ~b[K.POSITIVE], MASK_KEYS[task, mode]
            assert {k for k in (TEXT, ZEROED, MASKED) if k in b} == keys
            if TEXT in keys:
                assert (b[TEXT][neg] == -100).all()
                assert (b[TEXT][~neg] != -100).any(axis=1).all()
            if ZEROED in keys:
                assert not b[ZEROED][neg].any()
            if MASKED in keys:      # every positive pair has a masked region
                assert not b[MASKED][neg].any()
                assert b[MASKED][~neg].any(axis=1).all()


def test_mvm_flags_images_with_positive_texts(ctx):
    rng = np.random.default_rng(7)
    b = text_batch(rng, B=8)
    b[K.PIXELS] = np.zeros((3, 3, 32, 32), np.float32)
    b[K.IMAGE_INDEX] = np.array([0, 0, 1, 1, 2, 2, 0, 1])
    b[K.POSITIVE] = np.array([1, 1, 0, 0, 1, 0, 0, 0], bool)
    apply_masking("mvm", b, rng, ctx, "conditional", "pixels")
    assert b[K.MVM_APPLY].tolist() == [True, False, True]
    assert K.MLM_LABELS not in b
    apply_masking("mvm", b, rng, ctx, "joint", "pixels")
    assert (b[K.MLM_LABELS][~b[K.POSITIVE]] == -100).all() and K.MLM_LABELS in b


def test_registry_names():
    assert {"mlm", "itm", "mrfr", "mrc", "mrc-kl", "moc", "mrc-vlbert", "mvm"} <= set(
        TASKS)


def test_mlm_obj_masks_one_object_word_else_falls_back_to_bert(ctx):
    rng = np.random.default_rng(8)
    objects = np.array([5000, 5001, 5002])
    octx = MaskContext(0.15, MASK, CLS, SEP, ctx.random_ids, objects)
    b = text_batch(rng, B=3999, words=(24, 32))
    ids = b[K.INPUT_IDS]
    words = (b[K.TEXT_MASK] == 1) & (ids != CLS) & (ids != SEP)
    # two thirds of the captions name 1–3 objects, the rest name none
    for row in range(0, 3999, 3):
        for col in rng.choice(np.flatnonzero(words[row]), 2, replace=False):
            ids[row, col] = rng.choice(objects)
        ids[row + 1, 1 + rng.integers(words[row + 1].sum())] = objects[0]
    b[K.POSITIVE][3::7] = False
    orig = ids.copy()
    apply_masking("mlm-obj", b, rng, octx, "conditional", "regions")
    chosen = b[K.MLM_LABELS] != -100
    pos = b[K.POSITIVE]
    named = np.isin(orig, objects) & words
    has = named.any(axis=1)
    assert not chosen[~pos].any()
    # rows naming objects: exactly one position, always an object word, each equally likely
    assert (chosen[has & pos].sum(axis=1) == 1).all()
    assert named[chosen & (has & pos)[:, None]].all()
    two = pos & (named.sum(axis=1) == 2)
    first = (chosen & named)[two].argmax(axis=1) == named[two].argmax(axis=1)
    assert abs(first.mean() - 0.5) < 0.05, first.mean()
    # rows naming none: BERT's 15%, at least one, never special tokens or padding
    rest = pos & ~has
    rate = chosen[rest].sum() / words[rest].sum()
    assert abs(rate - 0.15) < 0.02 and chosen[rest].any(axis=1).all(), rate
    assert not chosen[~words].any()
    assert (b[K.MLM_LABELS][chosen] == orig[chosen]).all()
    assert abs((b[K.INPUT_IDS][chosen] == MASK).mean() - 0.8) < 0.03
