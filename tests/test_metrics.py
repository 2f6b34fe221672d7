"""Downstream metrics against hand-computed cases."""

import numpy as np
import pytest

from vlp.benchmarks.accuracy import accuracy
from vlp.benchmarks.meta_sum import meta_sum
from vlp.benchmarks.refcoco_plus import box_iou, refexp_accuracy
from vlp.benchmarks.retrieval import retrieval_recall
from vlp.benchmarks.vcr import vcr_scores
from vlp.benchmarks.vqa import normalize_vqa_answer, vqa_accuracy, vqa_score, vqa_target_score


def test_vqa_normalisation():
    assert normalize_vqa_answer("Two ") == "2"
    assert normalize_vqa_answer("the red Cube!") == "red cube"
    assert normalize_vqa_answer("1.5") == "1.5"
    assert normalize_vqa_answer("yes.") == "yes"


@pytest.mark.parametrize("agree,expected", [
    # k annotators of 10 say the prediction. Leave-one-out: the k subsets that drop an agreeing
    # annotator see k-1 matches, the 10-k others see k; acc = mean(min(1, matches/3)).
    (0, 0.0),
    (1, (1 * 0 + 9 * (1 / 3)) / 10),          # 0.3
    (2, (2 * (1 / 3) + 8 * (2 / 3)) / 10),    # 0.6
    (3, (3 * (2 / 3) + 7 * 1.0) / 10),        # 0.9
    (4, 1.0),
    (10, 1.0),
])
def test_vqa_accuracy_official_subset_averaging(agree, expected):
    answers = ["red"] * agree + ["blue"] * (10 - agree)
    assert vqa_accuracy("red", answers) == pytest.approx(expected)
    # the training-target table equals the official accuracy for 10 annotators
    assert vqa_target_score(agree) == pytest.approx(round(expected, 1))


def test_vqa_score_mean_percent():
    answers = [["2"] * 10, ["yes"] * 3 + ["no"] * 7]
    assert vqa_score(["two", "yes"], answers) == pytest.approx(100 * (1.0 + 0.9) / 2)
    with pytest.raises(ValueError, match="1 predictions for 2 questions"):
        vqa_score(["a"], answers)


def test_retrieval_recall_both_directions():
    # 3 images, 6 texts (2 captions each). scores[text, image]
    t2i = [0, 0, 1, 1, 2, 2]
    s = np.array([
        [0.9, 0.1, 0.0],   # t0 → i0 rank 0
        [0.2, 0.8, 0.1],   # t1 → i0 rank 1
        [0.1, 0.2, 0.3],   # t2 → i1 rank 1
        [0.0, 0.5, 0.4],   # t3 → i1 rank 0
        [0.7, 0.6, 0.5],   # t4 → i2 rank 2
        [0.3, 0.9, 0.2],   # t5 → i2 rank 2
    ])
    r = retrieval_recall(s, t2i, ks=(1, 2))
    # IR ranks: [0,1,1,0,2,2] → R@1 = 2/6, R@2 = 4/6
    assert r["ir_r1"] == pytest.approx(100 * 2 / 6)
    assert r["ir_r2"] == pytest.approx(100 * 4 / 6)
    # TR: image0 column [0.9,.2,.1,0,.7,.3] → t0 rank 0 → hit@1
    # image1 column [.1,.8,.2,.5,.6,.9] → t3 (0.5) rank 3, t2 (0.2) rank 4 → best 3: miss@2
    # image2 column [0,.1,.3,.4,.5,.2] → t4 (0.5) rank 0 → hit@1
    assert r["tr_r1"] == pytest.approx(100 * 2 / 3)
    assert r["tr_r2"] == pytest.approx(100 * 2 / 3)
    assert r["ir_mean"] == pytest.approx((r["ir_r1"] + r["ir_r2"]) / 2)


def test_iou_and_refexp():
    assert box_iou([0, 0, 2, 2], [1, 1, 3, 3]) == pytest.approx(1 / 7)
    assert box_iou([0, 0, 1, 1], [2, 2, 3, 3]) == 0.0
    assert box_iou([0, 0, 2, 2], [0, 0, 2, 2]) == 1.0
    pred = [[0, 0, 10, 10], [0, 0, 10, 10]]
    tgt = [[0, 0, 10, 9], [5, 5, 15, 15]]          # IoU 0.9 and 25/175
    assert refexp_accuracy(pred, tgt) == pytest.approx(50.0)


def test_accuracy_vcr_and_meta_sum():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 50.0
    choose = lambda picks: np.eye(4)[picks]          # noqa: E731  one-hot choice scores
    v = vcr_scores(choose([0, 1, 2, 3]), [0, 1, 0, 3], choose([1, 1, 1, 0]), [1, 0, 1, 0])
    assert v == {"q2a": 75.0, "qa2r": 75.0, "q2ar": 50.0}
    assert meta_sum({"vqa": 70, "ir": 80, "tr": 90, "nlvr2": 75, "refcoco+": 65, "ve": 1}) == 380
    with pytest.raises(KeyError, match="refcoco"):
        meta_sum({"vqa": 70, "ir": 80, "tr": 90, "nlvr2": 75})


def test_retrieval_ties_are_scored_at_their_expected_rank():
    """The issue's case: one score for every pair gave IR R@1 = 100 (ties counted for the
    model). Now chance: R@K = K/N images for IR."""
    r = retrieval_recall(np.zeros((500, 100)), np.arange(500) // 5)
    assert (r["ir_r1"], r["ir_r5"], r["ir_r10"]) == pytest.approx((1.0, 5.0, 10.0))
    # TR: each image has 5 of 500 texts: 1 - C(495, K)/C(500, K)
    from math import comb
    for k in (1, 5, 10):
        assert r[f"tr_r{k}"] == pytest.approx(100 * (1 - comb(495, k) / comb(500, k)))


def test_retrieval_ties_match_random_tie_breaking_by_simulation():
    """Scores on a coarse grid (many ties): the expected recall equals the mean recall over
    many random tie-breaks (a tiny random jitter, ranks then untied), written independently
    of the closed form: each jittered matrix ranked by a full argsort."""
    rng = np.random.default_rng(3)
    t2i = np.repeat(np.arange(6), [1, 2, 3, 1, 2, 3])
    s = rng.integers(0, 3, size=(12, 6)).astype(float)
    exact = retrieval_recall(s, t2i, ks=(1, 2, 4))
    runs = []
    for _ in range(4000):
        j = s + rng.uniform(0, 1e-3, s.shape)
        ir = [np.flatnonzero(np.argsort(-j[t]) == t2i[t])[0] for t in range(12)]
        tr = [min(np.flatnonzero(np.isin(np.argsort(-j[:, i]), np.flatnonzero(t2i == i))))
              for i in range(6)]
        runs.append([np.mean(np.array(ir) < k) for k in (1, 2, 4)]
                    + [np.mean(np.array(tr) < k) for k in (1, 2, 4)])
    sim = 100 * np.mean(runs, 0)
    got = [exact[f"{d}_r{k}"] for d in ("ir", "tr") for k in (1, 2, 4)]
    assert got == pytest.approx(sim, abs=2.0)


def test_argmax_ties_score_their_expectation():
    from vlp.benchmarks.accuracy import expected_accuracy
    from vlp.benchmarks.vqa import expected_vqa_score

    # row 0 ties its two classes (label 1: half credit), row 1 untied and right
    assert expected_accuracy([[0.0, 0.0], [0.2, 0.9]], [1, 1]) == pytest.approx(75.0)
    # VQA: question 0 ties "red" (10 annotators: 1.0) with "blue" (none: 0) → 0.5;
    # question 1 picks "2" outright, given by 3 annotators → 0.9
    vocab = ["red", "blue", "two"]
    logits = np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    answers = [["red"] * 10, ["2"] * 3 + ["no"] * 7]
    assert expected_vqa_score(logits, vocab, answers) == pytest.approx(100 * (0.5 + 0.9) / 2)
    # all three tied for question 1: (0 + 0 + 0.9) / 3
    logits[1] = 0
    assert expected_vqa_score(logits, vocab, answers) == pytest.approx(100 * (0.5 + 0.3) / 2)
