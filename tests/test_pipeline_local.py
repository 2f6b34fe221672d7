"""The pipeline end to end on small shards, without Ray (the plain local stream)."""

from __future__ import annotations

import collections

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from pipeline_world import C, D, write_source
from vlp.contract import batch_spec as K
from vlp.datasets.batching.length_buckets import bucket_batches, padding_waste
from vlp.datasets.stream.data_config import DataConfig, PixelConfig, RegionConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.batching.image_block import image_key
from vlp.datasets.stream.local_stream import local_batches, local_blocks
from vlp.datasets.stream.location import LOCATION_FEATURES, location_kind
from vlp.datasets.stream.region_select import select_regions
from vlp.datasets.stream.text_tokenizer import load_tokenizer

ALL_REGION_TASKS = {"mlm": 1, "itm": 1, "mrfr": 1, "mrc": 1, "mrc-kl": 1, "moc": 1,
                    "mrc-vlbert": 1}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("world")
    ids = {"coco": write_source(d, "coco", 80, shards=3, overlong_every=11, val_every=8),
           "cc": write_source(d, "cc", 80, shards=2, seed=1, captions=(1, 1))}
    return d, ids


def config(world, **kw):
    d, _ = world
    kw.setdefault("sources", (SourceConfig("coco", str(d / "coco")),))
    kw.setdefault("batch_units", 800)
    kw.setdefault("bucket_window", 256)
    return DataConfig(**kw)


def keys_of(ids):
    return {image_key(i): i for i in ids}


# ---- region selection, location features ------------------------------------------------

def test_region_selection_rules():
    conf = np.array([0.9, 0.1, 0.5, 0.3,     # image 0: 3 above 0.2
                     0.1, 0.05, 0.15,         # image 1: none above → top-min fallback
                     *np.linspace(0.99, 0.3, 12)])   # image 2: 12 above, max 10
    n = np.array([4, 3, 12])
    sel = select_regions(conf, n, RegionConfig(0.2, min_regions=2, max_regions=10))
    assert sel.counts.tolist() == [3, 2, 10]
    assert sel.fallback.tolist() == [False, True, False]
    assert sel.keep[:3].tolist() == [0, 2, 3]          # highest confidence first
    assert sel.keep[3:5].tolist() == [6, 4]            # fallback: top-2 by confidence
    assert sel.keep[5:].tolist() == list(range(7, 17))
    fixed = select_regions(conf, n, RegionConfig(fixed_regions=3))
    assert fixed.counts.tolist() == [3, 3, 3] and not fixed.fallback.any()


def test_location_features():
    boxes = np.array([[10, 20, 60, 120]], np.float32)
    w, h = np.array([100]), np.array([200])
    uni = LOCATION_FEATURES["uniter7"].fn(boxes, w, h)[0]
    assert np.allclose(uni, [0.1, 0.1, 0.6, 0.6, 0.5, 0.5, 0.25])
    ib = LOCATION_FEATURES["imagebert5"].fn(boxes, w, h)[0]
    assert np.allclose(ib, [0.1, 0.1, 0.6, 0.6, 50 * 100 / (100 * 200)])
    vb = LOCATION_FEATURES["box4"].fn(boxes, w, h)[0]
    assert np.allclose(vb, [0.1, 0.1, 0.6, 0.6])
    assert [LOCATION_FEATURES[k].width for k in ("uniter7", "imagebert5", "box4")] == [7, 5, 4]


# ---- batches -------------------------------------------------------------------------------

SPEC_DTYPES = {K.INPUT_IDS: torch.long, K.TEXT_MASK: torch.long, K.MLM_LABELS: torch.long,
               K.REGION_FEATS: torch.float16, K.REGION_LOC: torch.float32,
               K.REGION_MASK: torch.long, K.REGION_MASKED: torch.bool,
               K.REGION_ZEROED: torch.bool, K.REGION_FEAT_TARGETS: torch.float16,
               K.REGION_SOFT_LABELS: torch.float16, K.REGION_CLASS_LABELS: torch.long,
               K.IMAGE_FEAT: torch.float32, K.ITM_LABELS: torch.long, K.POSITIVE: torch.bool,
               K.PIXELS: torch.float32, K.PIXEL_MASK: torch.long, K.IMAGE_INDEX: torch.long,
               K.MVM_APPLY: torch.bool, K.NUM_EXAMPLES: torch.long, K.INPUT_UNITS: torch.long,
               K.ROW_LENGTH: torch.long, K.REAL_UNITS: torch.long, K.MLM_TARGETS: torch.long,
               K.REGION_TARGETS: torch.long}
REGION_TASK = {K.REGION_MASKED, K.REGION_ZEROED, K.REGION_TARGETS}
TASK_KEYS = {"mlm": {K.MLM_LABELS, K.MLM_TARGETS}, "itm": {K.ITM_LABELS},
             "mrfr": REGION_TASK | {K.REGION_FEAT_TARGETS},
             "mrc": REGION_TASK | {K.REGION_CLASS_LABELS},
             "mrc-kl": REGION_TASK | {K.REGION_SOFT_LABELS},
             "moc": REGION_TASK | {K.REGION_CLASS_LABELS},
             "mrc-vlbert": REGION_TASK | {K.REGION_CLASS_LABELS, K.REGION_SOFT_LABELS,
                                          K.IMAGE_FEAT}}


@pytest.mark.parametrize("location", ["uniter7", "imagebert", "vlbert"])   # names or aliases
def test_batches_follow_the_contract(world, location):
    cfg = config(world, location=location, image_feat=location == "vlbert")
    plan = plan_data(cfg, ALL_REGION_TASKS)
    src = local_batches(plan)
    L = LOCATION_FEATURES[location_kind(location)].width
    for task in list(ALL_REGION_TASKS) * 2:
        b = src.next(task)
        base = {K.INPUT_IDS, K.TEXT_MASK, K.REGION_FEATS, K.REGION_LOC, K.REGION_MASK,
                K.POSITIVE, K.NUM_EXAMPLES, K.INPUT_UNITS, K.ROW_LENGTH, K.REAL_UNITS}
        expect = base | TASK_KEYS[task] | ({K.IMAGE_FEAT} if location == "vlbert" else set())
        assert set(b) == expect, (task, set(b) ^ expect)
        for k, v in b.items():
            assert v.dtype == SPEC_DTYPES[k], (task, k, v.dtype)
        B, T = b[K.INPUT_IDS].shape
        N = b[K.REGION_FEATS].shape[1]
        assert b[K.REGION_FEATS].shape == (B, N, D) and b[K.REGION_LOC].shape == (B, N, L)
        assert int(b[K.NUM_EXAMPLES]) == B
        packed = int((b[K.TEXT_MASK].sum(1) + b[K.REGION_MASK].sum(1)).max())
        assert int(b[K.INPUT_UNITS]) == B * packed <= cfg.batch_units   # UNITER's unit
        assert int(b[K.ROW_LENGTH]) == packed     # the host's copy of the packed width
        assert int(b[K.REAL_UNITS]) == int(b[K.TEXT_MASK].sum() + b[K.REGION_MASK].sum())
        assert (b[K.INPUT_IDS][:, 0] == 101).all()
        assert (b[K.TEXT_MASK].sum(1) <= cfg.max_text_len + 2).all()
        if task == "mrc-kl":
            assert b[K.REGION_SOFT_LABELS].shape == (B, N, C)
    src.close()


def test_examples_match_the_shards(world):
    """Tokens decode to the stored caption; features are the selected regions, best first."""
    d, _ = world
    plan = plan_data(config(world, bucket_window=64), {"mlm": 1, "mrfr": 1})
    src = local_batches(plan, with_ids=True)
    b = src.next("mrfr")
    src.close()
    table = pq.read_table(d / "coco")
    by_key = {image_key(r["image_id"]): r for r in table.to_pylist()}
    tok = load_tokenizer()
    for i in range(3):
        row = by_key[int(b["example_text_key"][i])]
        ids = b[K.INPUT_IDS][i][b[K.TEXT_MASK][i] == 1].tolist()
        assert ids[0] == 101 and ids[-1] == 102
        assert tok.decode(ids[1:-1]) in [c.lower() for c in row["captions"]]
        feats = np.frombuffer(row["features"], "<f2").reshape(-1, D)
        conf = np.array(row["confidences"])
        n = int(b[K.REGION_MASK][i].sum())
        order = np.argsort(-conf, kind="stable")[:n]
        assert np.allclose(b[K.REGION_FEAT_TARGETS][i, :n].numpy(), feats[order], atol=1e-3)


def test_split_filter_and_overlong_counted(world):
    d, ids = world
    plan = plan_data(config(world), {"mlm": 1})
    src = local_batches(plan, with_ids=True)
    seen = set()
    while src.epoch < 1:
        seen |= set(src.next("mlm")["example_text_key"].tolist())
    src.close()
    rows = pq.read_table(d / "coco").to_pylist()
    usable = [r["image_id"] for r in rows if r["split"] == "train"
              and any(len(c.split()) <= 60 for c in r["captions"])]   # not all over-long
    assert set(usable) < set(ids["coco"])
    assert seen == set(keys_of(usable))            # every usable train image, no val image
    assert src.stats["overlong_dropped"] > 0 and src.stats["overlong_truncated"] == 0
    plan_t = plan_data(config(world, overlong="truncate", max_text_len=10), {"mlm": 1})
    src = local_batches(plan_t)
    b = src.next("mlm")
    src.close()
    assert b[K.TEXT_MASK].sum(1).max() <= 12 and src.stats["overlong_truncated"] > 0


@pytest.mark.parametrize("neg_prob", [0.0, 0.25, 0.5, 1.0])
def test_itm_negative_ratio_and_never_own_caption(world, neg_prob):
    """The configured share of ITM negatives, measured over ~2,000 examples (binomial
    standard deviation at most 0.011: tolerance 0.035 is over 3 of them; 0 and 1 exact)."""
    plan = plan_data(config(world, itm_neg_prob=neg_prob), {"itm": 1})
    src = local_batches(plan, with_ids=True)
    labels, n_own = [], 0
    for _ in range(120):
        b = src.next("itm")
        lab = b[K.ITM_LABELS]
        same = b["example_image_key"] == b["example_text_key"]
        assert (same == (lab == 1)).all()           # label 1 ⇔ the caption is the image's own
        assert (b[K.POSITIVE] == (lab == 1)).all()
        labels.append(lab)
    src.close()
    lab = torch.cat(labels).float()
    assert len(lab) > 1500
    negatives = 1 - lab.mean().item()
    if neg_prob in (0.0, 1.0):
        assert negatives == neg_prob
    else:
        assert abs(negatives - neg_prob) < 0.035, negatives
    assert src.stats["itm_no_donor"] == 0
    # negatives keep their example's lengths (no length cue) but for fallbacks, rarer in big batches
    assert src.stats["itm_negatives"] == int(round(negatives * len(lab)))
    assert src.stats["itm_length_mismatch"] <= 0.1 * src.stats["itm_negatives"]  # small batches


def test_masked_tasks_have_no_negatives(world):
    plan = plan_data(config(world), {"mlm": 1, "mrfr": 1})
    src = local_batches(plan)
    for task in ["mlm", "mrfr"] * 5:
        assert src.next(task)[K.POSITIVE].all()
    src.close()


def test_source_weights_are_example_shares(world):
    d, ids = world
    cfg = config(world, sources=(SourceConfig("coco", str(d / "coco"), 3.0),
                                 SourceConfig("cc", str(d / "cc"), 1.0)))
    plan = plan_data(cfg, {"mlm": 1})
    src = local_batches(plan, with_ids=True)
    cc = keys_of(ids["cc"])
    counts = collections.Counter()
    while src.epoch < 6:
        k = src.next("mlm")["example_text_key"].tolist()
        counts["cc"] += sum(x in cc for x in k)
        counts["all"] += len(k)
    src.close()
    assert abs(counts["cc"] / counts["all"] - 0.25) < 0.03, counts


def test_bucketing_respects_budget_and_cuts_waste():
    rng = np.random.default_rng(0)
    T = rng.integers(8, 40, 4000)
    V = rng.integers(10, 60, 4000)
    batches, tails = bucket_batches(T, V, 2000, rng)              # packed rows (regions)
    assert not tails and sorted(np.concatenate(batches).tolist()) == list(range(4000))
    for b in batches:
        assert len(b) * (T[b] + V[b]).max() <= 2000
    plain, _ = bucket_batches(T, V, 2000, rng, sort=False)
    assert padding_waste(T, V, batches) < 0.03 < 0.2 < padding_waste(T, V, plain)
    sep, _ = bucket_batches(T, V, 2000, rng, packed=False)       # separate padding (pixels)
    for b in sep:
        assert len(b) * (T[b].max() + V[b].max()) <= 2000
    assert padding_waste(T, V, sep, packed=False) < 0.12 < padding_waste(T, V, plain,
                                                                         packed=False)


def test_deterministic_for_a_seed(world):
    plan = plan_data(config(world), {"mlm": 1, "itm": 1})
    runs = []
    for _ in range(2):
        src = local_batches(plan)
        runs.append([src.next(t) for t in ["mlm", "itm", "mlm"]])
        src.close()
    for a, b in zip(*runs):
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_local_shards_are_disjoint(world):
    d, ids = world
    plan = plan_data(config(world), {"mlm": 1})
    seen = []
    for rank in range(2):
        keys = set()
        for t in local_blocks(plan, rank, 2)(0):
            keys |= set(t.column("image_id").to_pylist())
        seen.append(keys)
    assert not seen[0] & seen[1] and seen[0] | seen[1] == set(ids["coco"])


def test_host_memory_bounded_over_epochs(world):
    """Blocks alive in the window stay bounded: nothing accumulates per step."""
    plan = plan_data(config(world, bucket_window=64, read_rows=8), {"mlm": 1, "mrfr": 1})
    src = local_batches(plan)
    live = []
    while src.epoch < 8:
        src.next("mrfr")
        live.append(len(src._live))
    src.close()
    assert max(live) <= 40 and max(live[len(live) // 2:]) <= max(live[:len(live) // 2]) + 4


# ---- pixels (SOHO) ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pixel_world(tmp_path_factory):
    d = tmp_path_factory.mktemp("pixworld")
    ids = write_source(d, "coco", 24, shards=2, pixels=True, captions=(2, 5))
    return d, ids


def test_pixel_batches(pixel_world):
    d, ids = pixel_world
    pix = PixelConfig(shorter_side=48, longer_max=80, pad_multiple=16, token_stride=16)
    cfg = DataConfig(sources=(SourceConfig("coco", str(d / "coco")),), visual="pixels",
                     pixels=pix, batch_units=3000, bucket_window=64)
    plan = plan_data(cfg, {"mlm": 1, "itm": 1, "mvm": 1})
    src = local_batches(plan, with_ids=True)
    for task in ["itm", "mlm", "mvm", "itm"]:
        b = src.next(task)
        I, _, H, W = b[K.PIXELS].shape
        B = b[K.INPUT_IDS].shape[0]
        assert H % 16 == 0 and W % 16 == 0 and b[K.PIXEL_MASK].shape == (I, H, W)
        assert b[K.IMAGE_INDEX].shape == (B,) and set(b[K.IMAGE_INDEX].tolist()) == set(range(I))
        per_image = torch.bincount(b[K.IMAGE_INDEX], minlength=I)
        pos = torch.bincount(b[K.IMAGE_INDEX][b[K.POSITIVE]], minlength=I)
        assert (per_image == 4).all() and (pos == 2).all()     # SOHO: 2 positive + 2 negative
        own = b["example_image_key"] == b["example_text_key"]
        assert (own == b[K.POSITIVE]).all()                   # negatives never own captions
        for i in range(I):   # real area: shorter side 48 (or longer side 80)
            rows = b[K.PIXEL_MASK][i].any(1).sum().item()
            cols = b[K.PIXEL_MASK][i].any(0).sum().item()
            assert min(rows, cols) == 48 or max(rows, cols) == 80
        assert int(b[K.INPUT_UNITS]) == B * (b[K.INPUT_IDS].shape[1] + (H // 16) * (W // 16))
        if task == "itm":
            assert (b[K.ITM_LABELS] == b[K.POSITIVE].long()).all()
        if task == "mvm":
            assert b[K.MVM_APPLY].all() and K.MLM_LABELS not in b
        if task == "mlm":
            assert (b[K.MLM_LABELS][~b[K.POSITIVE]] == -100).all()
    src.close()


def test_window_collate_equals_per_batch_collate(world):
    """The window collate (one pass over several blocks, then the ITM swap in the collated
    arrays) gives exactly the arrays of collating each batch's references, swapped or not."""
    from vlp.datasets.batching.collate import ExampleRefs, collate_examples, example_lengths
    from vlp.datasets.batching.image_block import ImageBlock
    from vlp.datasets.batching.itm_negatives import apply_donors, choose_donors
    from vlp.datasets.batching.window_collate import (collate_window, resolve_regions,
                                                      swap_negatives)
    plan = plan_data(config(world, read_rows=8), {"mrc-kl": 1})
    blocks = {i: ImageBlock.from_table(t, plan.feature_dim, plan.num_classes, plan.loc_dim)
              for i, t in enumerate(local_blocks(plan)(0))}
    assert len(blocks) > 3
    rng = np.random.default_rng(0)
    pairs = [(b, r, c) for b, blk in blocks.items() for r in range(blk.num_images)
             for c in range(int(blk.num_captions()[r]))]
    batches = []
    for size in (1, 7, 30, 12):
        pick = [pairs[i] for i in rng.choice(len(pairs), size, replace=False)]
        b, r, c = (np.array(x, np.int64) for x in zip(*pick))
        batches.append(ExampleRefs(b, r, c, b, r, np.ones(size, bool)))
    tok = load_tokenizer(plan.tokenizer_path or None)
    kw = dict(feature_dim=plan.feature_dim, loc_dim=plan.loc_dim, num_classes=plan.num_classes,
              need_soft=True)
    trimmed = 0
    for refs, collated in zip(batches, collate_window(blocks, batches, tok,
                                                      feature_dim=plan.feature_dim,
                                                      need_soft=True)):
        for draw in range(-1, 20):   # -1: as collated; then ITM swaps of 20 donor draws
            want_refs, got = refs, collated
            if draw >= 0:
                keys, t, n = example_lengths(blocks, refs)
                donors = choose_donors(keys, t, n, 0.7, np.random.default_rng(draw))
                want_refs = apply_donors(refs, donors)
                got = swap_negatives({k: v.copy() if isinstance(v, np.ndarray) else v
                                      for k, v in collated.items()}, donors)
                trimmed += got[K.INPUT_IDS].shape != collated[K.INPUT_IDS].shape
                trimmed += got[K.REGION_MASK].shape != collated[K.REGION_MASK].shape
            got = dict(got)
            resolve_regions(got, True)   # regions and soft labels, gathered for this batch
            want = collate_examples(blocks, want_refs, tok, visual="regions", **kw)
            assert set(got) == set(want)
            for k in want:
                assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    assert trimmed   # some swaps gave away the longest text or the most regions


def test_itm_donors_differ_in_image_and_fit_the_row():
    from vlp.datasets.batching.collate import ExampleRefs
    from vlp.datasets.batching.itm_negatives import apply_donors, choose_donors
    rng = np.random.default_rng(0)
    B = 12
    keys = np.array([7] * 11 + [9])                 # 11 captions of one image, one other
    T, N = rng.integers(5, 15, B), rng.integers(5, 15, B)
    ar = np.arange(B)
    refs = ExampleRefs(np.zeros(B, np.int64), ar, ar, np.zeros(B, np.int64), ar,
                       np.ones(B, bool))
    width = (T + N).max()
    for _ in range(50):
        d = choose_donors(keys, T, N, 1.0, rng)
        new = apply_donors(refs, d)
        new_img, new_txt = new.image_row, new.text_row
        assert (keys[new_img] != keys[new_txt])[d.negative].all()   # never its own caption
        assert (keys[new_img] == keys[new_txt])[~d.negative].all()
        assert (T[new_txt] + N[new_img] <= width).all()              # the budget still holds
        assert d.negative.sum() + d.no_donor == B


def test_itm_negatives_keep_the_example_lengths():
    """A negative has its example's (text, regions) lengths whenever the batch holds a donor
    of the same length: lengths alone then cannot tell negatives from positives."""
    from vlp.datasets.batching.collate import ExampleRefs
    from vlp.datasets.batching.itm_negatives import apply_donors, choose_donors
    rng = np.random.default_rng(1)
    B = 64
    keys = rng.integers(0, 40, B)
    T, N = rng.integers(5, 12, B), rng.integers(6, 11, B)
    ar = np.arange(B)
    refs = ExampleRefs(np.zeros(B, np.int64), ar, ar, np.zeros(B, np.int64), ar,
                       np.ones(B, bool))
    changed_total = negatives = 0
    for _ in range(50):
        d = choose_donors(keys, T, N, 0.5, rng)
        new = apply_donors(refs, d)
        t_new, n_new = T[new.text_row], N[new.image_row]
        changed = (t_new != T) | (n_new != N)
        assert changed.sum() == d.length_mismatch
        assert not changed[~d.negative].any()
        changed_total += int(changed.sum())
        negatives += int(d.negative.sum())
    assert negatives > 1000 and changed_total == 0


def test_itm_length_fallback_is_counted():
    """No donor of equal length: the swap falls back to one that fits the row, and says so."""
    from vlp.datasets.batching.collate import ExampleRefs
    from vlp.datasets.batching.itm_negatives import apply_donors, choose_donors
    B = 4
    keys, T, N = np.arange(B), np.array([5, 6, 7, 8]), np.array([9, 8, 7, 6])
    ar = np.arange(B)
    refs = ExampleRefs(np.zeros(B, np.int64), ar, ar, np.zeros(B, np.int64), ar,
                       np.ones(B, bool))
    d = choose_donors(keys, T, N, 1.0, np.random.default_rng(0))
    new = apply_donors(refs, d)
    assert d.negative.all() and d.length_mismatch == B
    assert (T[new.text_row] + N[new.image_row] <= (T + N).max()).all()


def test_mlm_obj_masks_a_class_word_of_the_synthetic_world(tiny_world):
    from vlp.datasets.synth.vocabulary import CLASSES
    cfg = DataConfig(sources=(SourceConfig("coco", str(tiny_world / "images" / "coco")),),
                     batch_units=800, bucket_window=256)
    plan = plan_data(cfg, {"mlm-obj": 1})
    tok = load_tokenizer()
    class_ids = torch.tensor([tok.tokenizer.token_to_id(c) for c in CLASSES])
    src = local_batches(plan)
    try:
        named = fallback = 0
        for _ in range(4):
            b = src.next("mlm-obj")
            labels = b[K.MLM_LABELS]
            chosen = labels != -100
            has_class = torch.isin(torch.where(chosen, labels, b[K.INPUT_IDS]), class_ids)
            has_class = (has_class & (b[K.TEXT_MASK] == 1)).any(1)
            assert chosen.any(1).all()
            one = chosen[has_class].sum(1) == 1
            assert one.all() and torch.isin(labels[chosen & has_class[:, None]], class_ids).all()
            named += int(has_class.sum())
            fallback += int((~has_class).sum())
        assert named > 5 * fallback    # coco captions nearly always name an object
    finally:
        src.close()


def test_the_ray_data_map_runs_without_torch(world, tmp_path):
    """Ray Data's map workers unpickle the transform (and its plan) and run it; neither may
    import the task registry, which imports torch: ~1 CPU second in every such process."""
    import pickle
    import subprocess
    import sys

    from vlp.datasets.stream.image_rows import ImageRowTransform

    cfg = config(world)
    shard = sorted((world[0] / "coco").glob("*.parquet"))[0]
    (tmp_path / "map.pkl").write_bytes(pickle.dumps((ImageRowTransform(plan_data(cfg, ["mlm"])),
                                                     str(shard))))
    code = ("import pickle, sys, pyarrow.parquet as pq\n"
            f"transform, shard = pickle.loads(open({str(tmp_path / 'map.pkl')!r}, 'rb').read())\n"
            "out = transform(pq.read_table(shard), source_index=0)\n"
            "print(out.num_rows, 'torch' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows, torch_loaded = run.stdout.split()
    assert int(rows) > 0 and torch_loaded == "False"
