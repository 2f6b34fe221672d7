"""The leaderboard as data: one record per line, as CSV or JSON (``vlp leaderboard --csv /
--json`` and the parent run's artifacts), with each line's mean, 95% interval half-width,
per-seed values and verdict against the best line.

    print(csv_text(board))          # header + one row per line
    json.loads(json_text(board))    # {"sweep", "mode", "noise", "lines": [...]}
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from vlp.platform.tracking.leaderboard import KEYS, Leaderboard
from vlp.platform.tracking.leaderboard_protocols import protocol_header


def records(board: Leaderboard) -> list[dict[str, Any]]:
    out = []
    for rank, r in enumerate(board.rows, 1):
        rec: dict[str, Any] = {
            "rank": rank, "trial": r.trial, "data": r.data, "tasks": r.tasks,
            "ratios": r.ratios, "init": r.init, "seeds": r.seeds, "status": r.status(),
            "vs_best": r.verdict, "p_vs_best": r.p_vs_best, "steps": r.steps,
            "run_id": r.run_id, "family": r.family, "protocol": r.protocol}
        for key in KEYS:
            e = r.est.get(key)
            mean = e.mean if e else (r.meta_sum if key == "meta_sum" else r.scores.get(key))
            rec[f"{key}_mean"] = mean
            rec[f"{key}_ci95"] = e.ci95() if e else None
            rec[f"{key}_noise"] = ("" if not e or e.df <= 0 else
                                   "pooled" if e.pooled else "own seeds")
            rec[f"{key}_seeds"] = list(r.seed_values.get(key, [])) if e else []
        out.append(rec)
    return out


def csv_text(board: Leaderboard) -> str:
    recs = records(board)
    buf = io.StringIO()
    fields = list(recs[0]) if recs else ["rank", "trial"]
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for rec in recs:
        w.writerow({k: (" ".join(f"{x:g}" for x in v) if isinstance(v, list) else
                        "" if v is None else v) for k, v in rec.items()})
    return buf.getvalue()


def json_text(board: Leaderboard) -> str:
    return json.dumps({"sweep": board.sweep, "mode": board.mode,
                       "parent_run_id": board.parent_run_id, "noise": board.noise_note(),
                       "protocol": protocol_header(board.rows), "lines": records(board)}, indent=2, ensure_ascii=False) + "\n"


# ---- writing to the parent run -----------------------------------------------------------------

LEADERBOARD_MD = "leaderboard/leaderboard.md"
LEADERBOARD_CSV = "leaderboard/leaderboard.csv"
LEADERBOARD_JSON = "leaderboard/leaderboard.json"
LEADERBOARD_PNG = "leaderboard/meta_sum.png"


def log_leaderboard(tracking_uri: str, board: Leaderboard) -> None:
    """The table (markdown, CSV, JSON) and the chart (PNG, with error bars) as artifacts of
    the sweep's parent run; the best mean Meta-Sum there; each line's ``meta_sum_mean`` and
    ``meta_sum_ci95`` on its trial run."""
    from mlflow.tracking import MlflowClient

    from vlp.platform.tracking.leaderboard_plot import leaderboard_figure

    client = MlflowClient(tracking_uri)
    title = f"{board.sweep} ({board.mode})"
    header = "".join(f"{line}\n" for line in protocol_header(board.rows))
    client.log_text(board.parent_run_id,
                    f"# {title}\n\n{header}\n{board.markdown()}\n{board.noise_note()}\n",
                    LEADERBOARD_MD)
    client.log_text(board.parent_run_id, csv_text(board), LEADERBOARD_CSV)
    client.log_text(board.parent_run_id, json_text(board), LEADERBOARD_JSON)
    client.log_figure(board.parent_run_id, leaderboard_figure(board, title), LEADERBOARD_PNG)
    for r in board.rows:
        e = r.est.get("meta_sum")
        if e is None:
            continue
        client.log_metric(r.run_id, "meta_sum_mean", e.mean)
        if e.ci95() is not None:
            client.log_metric(r.run_id, "meta_sum_ci95", e.ci95())
        if r.verdict:
            client.set_tag(r.run_id, "vlp.vs_best", r.verdict)
    best = board.best()
    if best is not None:
        client.log_metric(board.parent_run_id, "best_meta_sum", best.meta_sum)
        client.set_tag(board.parent_run_id, "best_trial", f"{best.trial} {best.tasks}")
    client.set_tag(board.parent_run_id, "vlp.leaderboard.noise", board.noise_note()[:5000])
    client.log_metric(board.parent_run_id, "trials_completed",
                      sum(r.state == "completed" for r in board.rows))
    from vlp.platform.tracking.leaderboard_view import publish_view

    publish_view(tracking_uri, board)       # the MLflow UI's leaderboard view
