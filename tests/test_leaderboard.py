"""The leaderboard from MLflow runs (no Ray): Table 3's columns, ordering (a replay in line
order, a search by Meta-Sum), statuses, the artifacts on the parent run, `vlp leaderboard`
and the `vlp ui` command line."""

from __future__ import annotations

import pytest

from vlp.platform.tracking.leaderboard import LeaderboardError, find_sweep_run, load_leaderboard
from vlp.platform.tracking.leaderboard_export import log_leaderboard
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.tracking.mlflow_run import MlflowRun, embedded_tracking_uri

PARTS = {"vqa": 60.0, "ir": 50.0, "tr": 55.5, "nlvr2": 70.25, "refcoco_plus": 40.0}


def _trial(parent: MlflowRun, name: str, point: TrialPoint, metrics: dict, state: str,
           status: str = "FINISHED") -> None:
    run = parent.child(f"{name} {point.mix_label()}",
                       tags={"vlp.job": "sweep-trial", "vlp.sweep.trial": name, **point.tags(),
                             "vlp.state": state})
    run.log_metrics(metrics, step=4)
    run.finish(status)


@pytest.fixture
def store(tmp_path):
    uri = embedded_tracking_uri(tmp_path)
    parent = MlflowRun.open(uri, "vlp-sweep", run_name="demo-sweep",
                            tags={"vlp.job": "sweep", "vlp.sweep.mode": "search"},
                            artifact_location=(tmp_path / "mlartifacts").as_uri())
    best = TrialPoint.of({"mlm": 2, "itm": 2, "mrc-kl": 1, "mrfr": 1})
    _trial(parent, "t001", TrialPoint(), {**{k: v - 20 for k, v in PARTS.items()},
                                          "meta_sum": sum(PARTS.values()) - 100, "score": 1.0,
                                          "stage": 4, "stages": 4, "trial_steps": 1200},
           "completed")
    _trial(parent, "t002", best, {**PARTS, "meta_sum": sum(PARTS.values()),
                                  "score": sum(PARTS.values()), "stage": 4, "stages": 4,
                                  "trial_steps": 1500}, "completed")
    _trial(parent, "t003", TrialPoint.of({"itm": 1}, masking="joint", data="out"),
           {"ir": 10.0, "tr": 12.0, "score": 22.0, "stage": 1, "stages": 4,
            "trial_steps": 400}, "stopped", status="KILLED")
    _trial(parent, "t004", TrialPoint.of({"mrfr": 1}), {}, "failed", status="FAILED")
    return uri, parent


def test_rows_in_table3_columns_ranked_by_meta_sum(store):
    uri, parent = store
    board = load_leaderboard(uri, parent.run_id)
    assert [r.trial for r in board.rows] == ["t002", "t001", "t003", "t004"]
    md = board.markdown().splitlines()
    assert md[0] == ("| # | Trial | Pre-training data | Pre-training tasks | Ratios | Init | "
                     "Seeds | Meta-Sum | VQA | IR | TR | NLVR2 | RefCOCO+ | Steps | Status |")
    assert md[2] == ("| 1 | t002 | In-domain | MLM+ITM+MRC-kl+MRFR | 2:2:1:1 | random | 1 | "
                     "275.75 | 60.00 | 50.00 | 55.50 | 70.25 | 40.00 | 1,500 | done |")
    assert "| None | None | - | random | 1 | 175.75 |" in md[3]
    # one seed per line and no replicated line: no intervals, and it says so
    assert not board.has_intervals() and "one seed per line" in board.noise_note()
    assert md[4].endswith("| 400 | stopped by ASHA after stage 1/4 |")
    assert "Out-of-domain | ITM (w/o cond. mask)" in md[4]
    assert md[5].endswith("| failed |")
    assert board.best().trial == "t002"


def test_without_meta_sum_the_note_says_why_there_are_no_intervals(store):
    uri, parent = store
    board = load_leaderboard(uri, parent.run_id)
    for r in board.rows:          # a sweep whose benchmarks leave Meta-Sum parts out
        r.meta_sum = None
    assert "no line has all five Meta-Sum parts" in board.noise_note()


def test_replay_keeps_the_papers_line_order(store):
    uri, parent = store
    parent.set_tags({"vlp.sweep.mode": "replay:table3"})
    assert [r.trial for r in load_leaderboard(uri, parent.run_id).rows] == \
        ["t001", "t002", "t003", "t004"]


def test_artifacts_and_the_cli_print_the_same_table(store, capsys, tmp_path):
    from mlflow.tracking import MlflowClient

    from vlp.cli import main

    uri, parent = store
    board = load_leaderboard(uri, parent.run_id)
    log_leaderboard(uri, board)
    client = MlflowClient(uri)
    md = client.download_artifacts(parent.run_id, "leaderboard/leaderboard.md", str(tmp_path))
    png = client.download_artifacts(parent.run_id, "leaderboard/meta_sum.png", str(tmp_path))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert client.get_run(parent.run_id).data.metrics["best_meta_sum"] == pytest.approx(275.75)
    assert main(["leaderboard", "--run-dir", str(tmp_path)]) == 0
    printed = [l for l in capsys.readouterr().out.splitlines() if l.startswith("|")]
    assert printed == [l for l in open(md).read().splitlines() if l.startswith("|")]
    assert find_sweep_run(uri, "vlp-sweep").info.run_id == parent.run_id


def test_no_sweep_is_a_clear_error(tmp_path):
    uri = embedded_tracking_uri(tmp_path)
    MlflowRun.open(uri, "vlp-pretrain", run_name="x")
    with pytest.raises(LeaderboardError, match="no sweep in any experiment"):
        find_sweep_run(uri)
    with pytest.raises(LeaderboardError, match="experiments there: vlp-pretrain"):
        find_sweep_run(uri, "vlp-sweep")


def test_ui_binds_localhost_and_keeps_artifacts_out_of_the_cwd(tmp_path):
    from vlp.commands.ui import server_command, ui_hint

    uri = embedded_tracking_uri(tmp_path)
    cmd = server_command(uri, "127.0.0.1", 5123)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--backend-store-uri") + 1] == uri
    assert cmd[cmd.index("--default-artifact-root") + 1] == (tmp_path / "mlartifacts").as_uri()
    assert f"vlp ui --run-dir {tmp_path}" in ui_hint(uri)


def test_the_mlflow_ui_leaderboard_view(store):
    """After a sweep the experiment's shared view is its leaderboard: its trials, sorted by a
    metric named Meta-Sum (the line's value, two decimals), the parts and the mix as
    columns; `vlp ui` prints the URL that opens it."""
    import json

    from mlflow.tracking import MlflowClient

    from vlp.platform.tracking.leaderboard_view import VIEW_TAG, leaderboard_url

    uri, parent = store
    log_leaderboard(uri, load_leaderboard(uri, parent.run_id))
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("vlp-sweep")
    view = json.loads(exp.tags[VIEW_TAG])
    assert view["orderByKey"] == "metrics.`Meta-Sum`" and view["orderByAsc"] is False
    assert view["selectedColumns"][:7] == ["metrics.`Meta-Sum`", "metrics.`Meta-Sum ci95`",
                                           "metrics.`VQA`", "metrics.`IR`", "metrics.`TR`",
                                           "metrics.`NLVR2`", "metrics.`RefCOCO plus`"]
    assert "tags.`mix`" in view["selectedColumns"] and "tags.`outcome`" in view["selectedColumns"]
    # the view's own filter and sort, run through MLflow's search: the best line first
    runs = client.search_runs([exp.experiment_id], view["searchFilter"],
                              order_by=["metrics.`Meta-Sum` DESC"])
    assert [r.data.tags["vlp.sweep.trial"] for r in runs][:2] == ["t002", "t001"]
    assert runs[0].data.metrics["Meta-Sum"] == 275.75
    assert runs[1].data.metrics["Meta-Sum"] == round(sum(PARTS.values()) - 100, 2)
    assert "Meta-Sum" not in runs[2].data.metrics        # t003: stopped before Meta-Sum
    # the parts as `vlp leaderboard` prints them (two decimals), not the logged 8+ decimals
    by_trial = {r.data.tags["vlp.sweep.trial"]: r.data.metrics for r in runs}
    assert by_trial["t002"]["VQA"] == round(PARTS["vqa"], 2)
    assert by_trial["t002"]["RefCOCO plus"] == round(PARTS["refcoco_plus"], 2)
    assert by_trial["t003"]["IR"] == 10.0 and "VQA" not in by_trial["t003"]
    assert leaderboard_url("http://127.0.0.1:5000", uri) == (
        f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs?"
        f"workflowType=machine_learning&viewStateShareKey=vlp-leaderboard")


def test_a_partial_sweeps_view_sums_the_parts_it_scores(store):
    from vlp.platform.tracking.leaderboard_view import meta_sum_values

    uri, parent = store
    board = load_leaderboard(uri, parent.run_id)
    for r in board.rows:          # a sweep whose benchmarks leave Meta-Sum parts out
        r.meta_sum = None
    values, meaning = meta_sum_values(board)
    by_trial = {r.trial: values.get(r.run_id) for r in board.rows}
    assert by_trial == {"t002": round(sum(PARTS.values()), 2), "t001": 1.0, "t003": None,
                        "t004": None}
    assert meaning.startswith("the sum of the parts this sweep scores (VQA + IR + TR")


def test_the_view_columns_are_the_printed_values_with_the_interval_apart():
    from vlp.platform.tracking.leaderboard import Leaderboard, Row
    from vlp.platform.tracking.leaderboard_stats import Estimate
    from vlp.platform.tracking.leaderboard_view import printed_columns

    parts = {"vqa": 5.466666666666, "ir": 1 / 3, "tr": 2.0, "nlvr2": 50.004999, "refcoco_plus": 7.0}
    est = {k: Estimate(3, v, 0.5, 2.0) for k, v in parts.items()}
    est["meta_sum"] = Estimate(3, sum(parts.values()), 2.0, 2.0)
    row = Row(trial="t001", data="in", tasks="MLM", ratios="1", init="random",
              meta_sum=sum(parts.values()), scores=parts, score=None, stage=4, stages=4,
              state="completed", steps=1, seconds=1.0, run_id="r1", est=est)
    board = Leaderboard("s", "search", "p", [row])
    columns = printed_columns(board)["r1"]
    assert columns["VQA"] == 5.47 and columns["IR"] == 0.33 and columns["NLVR2"] == 50.0
    assert columns["Meta-Sum ci95"] == round(est["meta_sum"].ci95(), 2)
    assert f"{columns['Meta-Sum ci95']:.2f}" in row.cell("meta_sum")     # as the CLI prints
