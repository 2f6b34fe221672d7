"""The leaderboard chart: one stacked bar per line (the mean VQA, IR, TR, NLVR2, RefCOCO+
adding up to the mean Meta-Sum), so a mix's total and where it comes from read at a glance;
a black error bar is the 95% interval of Meta-Sum, and a dashed line marks the lower end of
the best line's interval (bars whose interval reaches it may not be worse)."""

from __future__ import annotations

from typing import Any

from vlp.benchmarks import meta_sum
from vlp.platform.tracking.leaderboard import Leaderboard

LEGEND_STRIP_IN = 0.3        # inches kept free under the axes for the legend


def leaderboard_figure(board: Leaderboard, title: str = "") -> Any:
    """Agg canvas, no pyplot global state (safe in any thread or worker)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = list(reversed(board.rows))          # the first row on top
    height = 1.6 + 0.42 * max(len(rows), 1)
    fig = Figure(figsize=(9, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    labels = [f"{r.trial} {r.tasks}" + (f" [{r.data}]" if r.data not in ("", "None") else "")
              for r in rows]
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    for key, label, colour in ((p.key, p.label, p.colour) for p in meta_sum.PARTS):
        widths = [(r.est[key].mean if key in r.est else r.scores.get(key)) or 0.0 for r in rows]
        ax.barh(y, widths, left=left, color=colour, label=label, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    cis = [(r.est["meta_sum"].ci95() if "meta_sum" in r.est else None) or 0.0 for r in rows]
    # the bar's end is the sum of the mean parts, which is the mean Meta-Sum; a line without
    # Meta-Sum (stopped early) ends at its parts so far
    ends = [r.meta_sum if r.meta_sum is not None else total for r, total in zip(rows, left)]
    if any(cis):
        ax.errorbar(ends, y, xerr=cis, fmt="none", ecolor="black", elinewidth=1.2, capsize=3)
        best = board.best()
        if best is not None and best.est["meta_sum"].ci95() is not None:
            ax.axvline(best.meta_sum - best.est["meta_sum"].ci95(), color="grey",
                       linestyle="--", linewidth=0.8)
    right = max([a + c for a, c in zip(ends, cis)] + [1.0])
    for yi, r, total, ci in zip(y, rows, ends, cis):
        text = r.status() if r.meta_sum is None else (
            f"{r.meta_sum:.1f}" + (f" ± {ci:.1f}" if ci else "")
            + (f" ({r.verdict})" if r.verdict and r.verdict != "below" else ""))
        ax.text(total + ci + right * 0.01, yi, text, va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("Meta-Sum (VQA + IR + TR + NLVR2 + RefCOCO+)")
    ax.set_xlim(0, right * 1.25)
    if title:
        ax.set_title(title, fontsize=10)
    # below the axes, in a strip of its own: inside them it covered the bottom rows' bars
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, loc="lower center", ncol=len(names), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, LEGEND_STRIP_IN / height, 1, 1))
    return fig
