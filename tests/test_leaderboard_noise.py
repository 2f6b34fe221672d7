"""The leaderboard's noise: t quantiles against the printed table, the 95% t-interval and
Welch's "not distinguishable from the best" rule against values worked by hand, pooled noise
for single-seed lines, one line per point, and the same figures in MLflow and the CLI's
--csv / --json."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from vlp.platform.tracking.leaderboard import load_leaderboard, ranking_verdict
from vlp.platform.tracking.leaderboard_export import log_leaderboard
from vlp.platform.tracking.leaderboard_stats import (estimate, indistinguishable, pooled_variance,
                                                     t_quantile, t_two_sided_p, welch_p)
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.tracking.mlflow_run import MlflowRun, embedded_tracking_uri

# Student's t, 0.975 quantile, from a printed table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042, 100: 1.984}


def test_t_quantiles_match_the_table():
    for df, t in T975.items():
        assert t_quantile(0.975, df) == pytest.approx(t, abs=5e-4)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.960, abs=5e-4)     # the normal's
    assert t_two_sided_p(2.776445, 4) == pytest.approx(0.05, abs=1e-6)
    assert t_two_sided_p(0.0, 3) == pytest.approx(1.0)


def test_interval_over_seeds_by_hand():
    e = estimate([160.0, 165.0, 170.0])        # mean 165, s = 5, n = 3
    assert (e.n, e.mean, e.df) == (3, 165.0, 2.0)
    assert e.ci95() == pytest.approx(4.303 * 5 / math.sqrt(3), abs=2e-3)   # 12.42
    assert estimate([150.0]).ci95() is None                                # one seed: none


def test_welch_rule_by_hand():
    a = estimate([160.0, 165.0, 170.0])
    # equal spreads and n: var of each mean 25/3, t = 10 / √(50/3) = 2.449, Welch df
    # = (50/3)² / (2 · (25/3)² / 2) = 4, t_0.975(4) = 2.776 > 2.449 → not distinguishable
    close = estimate([150.0, 155.0, 160.0])
    assert indistinguishable(close, a) is True
    # 12 apart: t = 12 / √(50/3) = 2.939 > 2.776 → distinguishable
    far = estimate([148.0, 153.0, 158.0])
    assert indistinguishable(far, a) is False
    assert welch_p(far, a) < 0.05 < welch_p(close, a)
    # unequal spreads: var means 25/3 and 4/3, t = 13 / √(29/3) = 4.181,
    # df = (29/3)² / ((25/3)²/2 + (4/3)²/2) = 2.624; the two-sided p there is 0.0323
    p = welch_p(estimate([150.0, 152.0, 154.0]), a)
    df = (29 / 3) ** 2 / ((25 / 3) ** 2 / 2 + (4 / 3) ** 2 / 2)
    assert df == pytest.approx(2.624, abs=1e-3)
    assert p == pytest.approx(t_two_sided_p(13 / math.sqrt(29 / 3), df)) == \
        pytest.approx(0.0323, abs=5e-4)
    assert indistinguishable(estimate([150.0]), a) is None       # no spread: no verdict


def test_pooled_variance_by_hand():
    # (2 · 16 + 1 · 2) / 3: groups [100, 104, 96] (s² 16) and [10, 12] (s² 2); [7] has none
    var, df = pooled_variance([[100.0, 104.0, 96.0], [10.0, 12.0], [7.0]])
    assert (var, df) == (pytest.approx(34 / 3), 3.0)
    assert pooled_variance([[1.0], [2.0]]) is None
    single = estimate([130.0], pooled=(16.0, 2.0))
    assert single.pooled and single.ci95() == pytest.approx(4.303 * 4.0, abs=2e-3)


def _trial(parent: MlflowRun, name: str, point: TrialPoint, metrics: dict,
           tags: dict | None = None) -> None:
    run = parent.child(f"{name} {point.mix_label()}",
                       tags={"vlp.job": "sweep-trial", "vlp.sweep.trial": name, **point.tags(),
                             "vlp.state": "completed", **(tags or {})})
    run.log_metrics({"stage": 4, "stages": 4, "trial_steps": 10, **metrics}, step=4)
    run.finish("FINISHED")


@pytest.fixture
def pooled_store(tmp_path):
    """No pretraining with 3 seeds (Meta-Sum 100, 104, 96: s² = 16, 2 df), three pretrained
    mixes with one seed, and a twin of the best that reused its results."""
    return make_store(tmp_path, (100.0, 104.0, 96.0))


def make_store(tmp_path, none_seeds: tuple[float, float, float]):
    uri = embedded_tracking_uri(tmp_path)
    parent = MlflowRun.open(uri, "vlp-sweep", run_name="noise",
                            tags={"vlp.job": "sweep", "vlp.sweep.mode": "search"},
                            artifact_location=(tmp_path / "mlartifacts").as_uri())
    seeds = {f"seed{s}.meta_sum": v for s, v in enumerate(none_seeds)}
    seeds.update({f"seed{s}.vqa": v for s, v in enumerate((40.0, 41.0, 42.0))})
    mean = sum(none_seeds) / 3
    _trial(parent, "t001", TrialPoint(), {"meta_sum": mean, "score": mean, "vqa": 41.0,
                                          **seeds})
    best = TrialPoint.of({"mlm": 2, "itm": 2, "mrc-kl": 1, "mrfr": 1})
    _trial(parent, "t002", best, {"meta_sum": 130.0, "score": 130.0, "vqa": 50.0})
    _trial(parent, "t003", TrialPoint.of({"mlm": 1}), {"meta_sum": 103.0, "score": 103.0})
    _trial(parent, "t004", TrialPoint.of({"mlm": 1, "itm": 1}),
           {"meta_sum": 124.0, "score": 124.0})
    _trial(parent, "t005", best, {"meta_sum": 130.0, "score": 130.0},
           tags={"vlp.duplicate_of": "t002"})
    return uri, parent


def test_single_seed_lines_take_the_pooled_noise(pooled_store):
    uri, parent = pooled_store
    board = load_leaderboard(uri, parent.run_id)
    rows = {r.trial: r for r in board.rows}
    assert [r.trial for r in board.rows] == ["t002", "t004", "t003", "t001"]   # t005: a twin
    # single seed: ± t_0.975(2) · √16 = 17.21 from no pretraining's 3 seeds
    assert rows["t002"].est["meta_sum"].ci95() == pytest.approx(4.303 * 4, abs=2e-3)
    assert rows["t002"].est["meta_sum"].pooled and not rows["t001"].est["meta_sum"].pooled
    assert rows["t001"].est["meta_sum"].ci95() == pytest.approx(4.303 * 4 / math.sqrt(3),
                                                                abs=2e-3)
    # vs t002 (var of mean 16, 2 df): t004 6 below, t = 6/√32 = 1.06 < 2.776 (df 4) → ≈best;
    # t003 27 below, t = 4.77 > 2.776 → below
    assert [rows[t].verdict for t in ("t002", "t004", "t003", "t001")] == \
        ["best", "≈best", "below", "below"]
    assert "1/3 seed(s) per line" in board.noise_note()
    assert "pooled spread of t001 None (3 seeds)" in board.noise_note()
    md = board.markdown().splitlines()
    assert "| 1 | 130.00 ± 17.21 | best | 50.00 ± " in md[2]
    assert "| 3 | 100.00 ± 9.94 | below | 41.00 ± 2.48 |" in md[5]    # 4.303 · 1/√3


def test_mlflow_and_cli_carry_the_intervals(pooled_store, tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    from vlp.cli import main

    uri, parent = pooled_store
    board = load_leaderboard(uri, parent.run_id)
    log_leaderboard(uri, board)
    client = MlflowClient(uri)
    arts = {a.path for a in client.list_artifacts(parent.run_id, "leaderboard")}
    assert arts == {"leaderboard/leaderboard.md", "leaderboard/leaderboard.csv",
                    "leaderboard/leaderboard.json", "leaderboard/meta_sum.png"}
    t2 = next(r for r in board.rows if r.trial == "t002")
    m = client.get_run(t2.run_id).data.metrics
    assert m["meta_sum_mean"] == 130.0
    assert m["meta_sum_ci95"] == pytest.approx(17.21, abs=0.01)

    assert main(["leaderboard", "--run-dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [l["trial"] for l in data["lines"]] == ["t002", "t004", "t003", "t001"]
    t1 = data["lines"][3]
    assert t1["meta_sum_seeds"] == [100.0, 104.0, 96.0] and t1["meta_sum_noise"] == "own seeds"
    assert data["lines"][0]["meta_sum_noise"] == "pooled" and "pooled" in data["noise"]
    assert main(["leaderboard", "--run-dir", str(tmp_path), "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["trial"], r["vs_best"]) for r in rows] == [
        ("t002", "best"), ("t004", "≈best"), ("t003", "below"), ("t001", "below")]
    assert float(rows[1]["meta_sum_ci95"]) == pytest.approx(17.21, abs=0.01)
    assert main(["leaderboard", "--run-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "± = 95% t-interval" in out and "Welch" in out
    assert "within noise of the best (not a real difference at this budget): t004" in out


def test_the_verdicts_say_what_the_ranking_supports(pooled_store, tmp_path):
    from vlp.commands.demo import pretraining_verdict
    from vlp.platform.tracking.leaderboard import ranking_verdict

    uri, parent = pooled_store
    board = load_leaderboard(uri, parent.run_id)
    # none 100 (var of mean 16/3, 2 df) vs 130 (16, 2 df): t = 30 / √(64/3) = 6.50 → beyond
    assert "beats no pretraining" in pretraining_verdict(board)
    said = ranking_verdict(board)
    assert said[0].startswith("best: t002 MLM+ITM+MRC-kl+MRFR")
    assert "within noise of the best" in said[1] and "t004" in said[1] and "t003" not in said[1]
    # none at 124 (seeds 120, 128, 124: the same spread): t = 6 / √(64/3) = 1.30 → within
    uri, parent = make_store(tmp_path / "close", (120.0, 128.0, 124.0))
    close = pretraining_verdict(load_leaderboard(uri, parent.run_id))
    assert "within seed noise" in close and "finetune_calibration.py" in close


def test_one_seed_everywhere_is_not_evidence(tmp_path):
    from vlp.commands.demo import pretraining_verdict
    from vlp.platform.tracking.leaderboard import ranking_verdict

    uri = embedded_tracking_uri(tmp_path)
    parent = MlflowRun.open(uri, "vlp-sweep", run_name="one", tags={"vlp.job": "sweep"})
    _trial(parent, "t001", TrialPoint(), {"meta_sum": 100.0, "score": 100.0})
    _trial(parent, "t002", TrialPoint.of({"mlm": 1}), {"meta_sum": 140.0, "score": 140.0})
    board = load_leaderboard(uri, parent.run_id)
    assert not board.has_intervals() and "| 140.00 |" in board.markdown()
    assert "vs best" not in board.markdown()
    assert "not evidence" in pretraining_verdict(board)
    assert "not evidence" in ranking_verdict(board)[1]


def test_asha_stopping_every_pretrained_mix_still_gets_a_verdict(tmp_path):
    """The demo's usual ending at its budget: ASHA stops the pretrained mixes after stage 1,
    so no pretrained line has Meta-Sum. The verdict compares the finished parts, each against
    no pretraining's spread (refcoco+ seeds 50, 54: s² 8, 1 df; pooled for the one seed)."""
    from vlp.commands.demo import pretraining_verdict
    from vlp.platform.tracking.leaderboard import PARTS

    ref = dict(PARTS)
    key = next(k for k, label in PARTS if label == "RefCOCO+")
    assert ref[key] == "RefCOCO+"

    def store(name: str, stopped_score: float):
        uri = embedded_tracking_uri(tmp_path / name)
        parent = MlflowRun.open(uri, "vlp-sweep", run_name=name, tags={"vlp.job": "sweep"})
        _trial(parent, "t001", TrialPoint(),
               {"meta_sum": 150.0, "score": 150.0, key: 52.0, "seed0.meta_sum": 148.0,
                "seed1.meta_sum": 152.0, f"seed0.{key}": 50.0, f"seed1.{key}": 54.0})
        best = TrialPoint.of({"mlm": 2, "itm": 2, "mrc-kl": 1, "mrfr": 1})
        for trial, score in (("t002", stopped_score), ("t003", 30.0)):
            run = parent.child(f"{trial} {best.mix_label()}",
                               tags={"vlp.job": "sweep-trial", "vlp.sweep.trial": trial,
                                     **best.tags(), "vlp.state": "stopped"})
            run.log_metrics({"stage": 1, "stages": 4, "trial_steps": 600, "score": score,
                             key: score}, step=1)
            run.finish("KILLED")
        return load_leaderboard(uri, parent.run_id)

    # 48 vs mean 52: t = 4 / √(8 + 4) = 1.15, far inside t_0.975(≈2) → within noise
    said = pretraining_verdict(store("within", 48.0))
    assert said.startswith("demo: ASHA stopped every pretrained mix")
    assert "after stage 1/4" in said and "RefCOCO+ 48.00 vs 52.00 ± " in said
    assert "within seed noise" in said and "finetune_calibration.py" in said
    # 150 vs 52: t = 98 / √12 = 28.3; Welch df = 12² / (8²/1 + 4²/1) = 1.8, p ≈ 0.002:
    # beyond
    far = pretraining_verdict(store("far", 150.0))
    assert "RefCOCO+ 150.00" in far and "beat no pretraining beyond seed noise" in far
    # the best stopped mix is then t003 at 30: t = 22 / √12 = 6.35 → below, beyond noise
    low = pretraining_verdict(store("low", 0.0))
    assert "RefCOCO+ 30.00" in low and "below, beyond seed noise" in low
    assert "does not separate pretraining from none" in low


def test_a_nonfinite_meta_sum_is_a_failed_line_last_and_never_best(tmp_path):
    """A diverged model's NaN (or inf) Meta-Sum: before, NaN sorted first (-(nan) compares
    false) and max() kept it as best; a NaN seed made its line's mean NaN."""
    uri, parent = make_store(tmp_path, (100.0, 104.0, 96.0))
    _trial(parent, "t006", TrialPoint.of({"itm": 1}),
           {"meta_sum": math.nan, "score": math.nan, "vqa": math.nan})
    _trial(parent, "t007", TrialPoint.of({"mrfr": 1}), {"meta_sum": math.inf, "score": 1e9})
    _trial(parent, "t008", TrialPoint.of({"mrc": 1}),       # one of its 2 seeds diverged
           {"meta_sum": math.nan, "score": math.nan, "seed0.meta_sum": 200.0,
            "seed1.meta_sum": math.nan})
    board = load_leaderboard(uri, parent.run_id)
    order = [r.trial for r in board.rows]
    assert order[:4] == ["t002", "t004", "t003", "t001"]
    assert sorted(order[4:]) == ["t006", "t007", "t008"]
    assert board.best().trial == "t002"
    rows = {r.trial: r for r in board.rows}
    for t in ("t006", "t007", "t008"):
        r = rows[t]
        assert (r.state, r.meta_sum, r.verdict) == ("failed", None, "")
        assert "meta_sum" not in r.est and "failed after stage 4/4: Meta-Sum is " in r.status()
    assert rows["t002"].verdict == "best"
    assert ranking_verdict(board)[0].startswith("best: t002")
    md = board.markdown().splitlines()
    assert all(": Meta-Sum is" in line and "| – |" in line for line in md[-3:])


def test_best_and_noise_skip_a_nan_row_built_directly():
    from vlp.platform.tracking.leaderboard import Leaderboard, Row, sort_key

    def row(name, meta):
        return Row(name, "", "", "", "", meta, {}, meta, None, None, "completed", None, None,
                   name, seed_values={"meta_sum": [meta]})

    rows = [row("nan", math.nan), row("a", 120.0), row("b", 110.0)]
    board = Leaderboard("s", "search", "p", rows)
    board.estimate_noise()
    assert board.best().trial == "a" and rows[0].verdict == ""
    assert [r.trial for r in sorted(rows, key=sort_key)] == ["a", "b", "nan"]
