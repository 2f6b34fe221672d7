"""Non-finite scores score nothing (issue 39, item 9): NaN and ±inf rank below every finite
score and are never a hit, on every benchmark's metric; a row or query with no finite score
earns 0. The tie rule (docs/testing.md: a tie is credited at its expected value) still holds
among the finite scores. Expected values are worked by hand here, not read from the code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vlp.benchmarks.accuracy import expected_accuracy, expected_hits
from vlp.benchmarks.retrieval import retrieval_recall
from vlp.benchmarks.vcr import vcr_scores
from vlp.benchmarks.vqa import expected_vqa_score

BAD = [np.nan, np.inf, -np.inf]


@pytest.mark.parametrize("bad", BAD)
def test_retrieval_all_nonfinite_scores_zero(bad):
    """The issue's case: a NaN matrix gave TR R@1/5/10 = 100 (NaN compares false, so no
    caption ranked above its own) and IR NaN."""
    r = retrieval_recall(np.full((50, 10), bad), np.arange(50) // 5)
    assert r == {k: 0.0 for k in r} and len(r) == 8


def test_retrieval_nonfinite_ranks_below_every_finite_score():
    # 3 images, 3 texts (one caption each); scores[text, image]
    t2i = [0, 1, 2]
    s = np.array([[0.1, np.nan, np.inf],     # t0: true 0.1, the rest non-finite → rank 0
                  [0.5, np.nan, 0.2],        # t1: its own image NaN → never a hit
                  [-np.inf, 0.3, 0.3]])      # t2: ties 0.3 with image 1 → 1/2 at R@1
    r = retrieval_recall(s, t2i, ks=(1, 2))
    assert r["ir_r1"] == pytest.approx(100 * (1 + 0 + 0.5) / 3)
    assert r["ir_r2"] == pytest.approx(100 * (1 + 0 + 1) / 3)
    # TR: image 0's column [0.1, 0.5, -inf]: t0 second → hit at 2, not 1;
    # image 1's [nan, nan, 0.3]: own t1 is NaN → a miss; image 2's [inf, 0.2, 0.3]: own t2
    # first (the inf ranks last)
    assert r["tr_r1"] == pytest.approx(100 * (0 + 0 + 1) / 3)
    assert r["tr_r2"] == pytest.approx(100 * (1 + 0 + 1) / 3)


def test_retrieval_true_pairs_finite_the_rest_nan():
    """NaN everywhere but the true pairs: the NaNs rank below the finite true pairs (the
    rule), so every query hits; the same matrix with the true pairs NaN and the rest finite
    scores 0 (before: IR = TR = 100 for both)."""
    t2i = np.arange(20) // 2
    s = np.full((20, 10), np.nan)
    s[np.arange(20), t2i] = 0.0
    assert retrieval_recall(s, t2i)["ir_r1"] == 100.0
    s = np.zeros((20, 10))
    s[np.arange(20), t2i] = np.nan
    r = retrieval_recall(s, t2i)
    assert (r["ir_mean"], r["tr_mean"]) == (0.0, 0.0)


def test_retrieval_ties_unchanged_among_finite_scores():
    """The tie rule holds with non-finite scores present: IR chance is K/(finite images)."""
    s = np.zeros((10, 10))
    s[:, 5:] = np.nan                      # images 5..9 never scored
    t2i = np.arange(10) % 5                # every text's image among the scored ones
    r = retrieval_recall(s, t2i, ks=(1, 2))
    assert (r["ir_r1"], r["ir_r2"]) == pytest.approx((20.0, 40.0))


@pytest.mark.parametrize("bad", BAD)
def test_argmax_benchmarks_score_nonfinite_rows_zero(bad):
    """NLVR2, SNLI-VE and VCR's stages (expected_accuracy/expected_hits): before, NaN
    accuracy (NaN max) or the first index."""
    assert expected_accuracy(np.full((4, 2), bad), [0, 1, 0, 1]) == 0.0
    assert expected_accuracy(np.full((3, 3), bad), [0, 1, 2]) == 0.0
    v = vcr_scores(np.full((2, 4), bad), [0, 1], np.zeros((2, 4)), [0, 1])
    assert v == {"q2a": 0.0, "qa2r": 25.0, "q2ar": 0.0}


def test_argmax_nonfinite_choice_ranks_last():
    # row 0: +inf on the wrong class, finite right → right; row 1: NaN on the right class →
    # wrong; row 2: two finite tied, one NaN → 1/2
    scores = [[np.inf, 0.0, -1.0], [0.0, np.nan, -1.0], [1.0, 1.0, np.nan]]
    assert expected_hits(scores, [1, 1, 0]).tolist() == [1.0, 0.0, 0.5]


@pytest.mark.parametrize("bad", BAD)
def test_vqa_nonfinite_logits_score_zero(bad):
    vocab = ["red", "blue"]
    answers = [["red"] * 10, ["blue"] * 10]
    assert expected_vqa_score(np.full((2, 2), bad), vocab, answers) == 0.0
    # one finite logit wins over a non-finite one, whatever its value
    assert expected_vqa_score(np.array([[bad, -5.0], [-5.0, bad]]), vocab, answers) == 0.0
    assert expected_vqa_score(np.array([[-5.0, bad], [bad, -5.0]]), vocab, answers) == 100.0


def test_label_minus_one_is_refused_not_credited_to_the_last_class():
    """np's index -1 is the last column: a label -1 used to score the last class right."""
    with pytest.raises(ValueError, match="label -1 in row 1 is not a class index 0..2"):
        expected_hits([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], [2, -1])
    with pytest.raises(ValueError, match="label 3 in row 0"):
        expected_accuracy([[0.0, 0.0, 1.0]], [3])


def test_a_sweep_trial_with_a_nonfinite_part_fails(monkeypatch, tmp_path):
    """The sweep never averages a NaN part into Optuna's objective or ASHA's rungs: the
    stage raises, so the trial is failed (and the leaderboard puts it last)."""
    import vlp.platform.finetune as finetune
    import vlp.platform.sweep.trial_configs as trial_configs
    from vlp.platform.finetune.run import DownstreamReport
    from vlp.platform.sweep.point import TrialPoint
    from vlp.platform.sweep.trial import NonFiniteScore, _finetune
    from vlp.platform.sweep.trial_state import Replicate

    monkeypatch.setattr(trial_configs, "finetune_kwargs", lambda *a, **k: {})
    monkeypatch.setattr(finetune, "finetune_and_evaluate",
                        lambda **k: DownstreamReport({"ir": math.nan, "tr": 3.0}, None))
    from types import SimpleNamespace

    rep = Replicate(0)
    with pytest.raises(NonFiniteScore, match="retrieval scored ir=nan for t001"):
        _finetune(SimpleNamespace(cfg=None), TrialPoint(), "t001", str(tmp_path), "run", "retrieval", rep)
    assert rep.scores == {}
