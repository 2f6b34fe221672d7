"""The leaderboard chart: one stacked bar per trial (VQA, IR, TR, NLVR2, RefCOCO+ adding up
to Meta-Sum), so a mix's total and where it comes from read at a glance."""

from __future__ import annotations

from typing import Any

from vlp.platform.leaderboard import PARTS, Leaderboard

COLOURS = ("#4C72B0", "#55A868", "#8172B2", "#C44E52", "#CCB974")


def leaderboard_figure(board: Leaderboard, title: str = "") -> Any:
    """Agg canvas, no pyplot global state (safe in any thread or worker)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = list(reversed(board.rows))          # the first row on top
    fig = Figure(figsize=(9, 1.2 + 0.42 * max(len(rows), 1)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    labels = [f"{r.trial} {r.tasks}" + (f" [{r.data}]" if r.data not in ("", "None") else "")
              for r in rows]
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    for (key, label), colour in zip(PARTS, COLOURS):
        widths = [r.scores.get(key) or 0.0 for r in rows]
        ax.barh(y, widths, left=left, color=colour, label=label, height=0.7)
        left = [a + b for a, b in zip(left, widths)]
    for yi, r, total in zip(y, rows, left):
        text = f"{r.meta_sum:.1f}" if r.meta_sum is not None else r.status()
        ax.text(total + max(left + [1.0]) * 0.01, yi, text, va="center", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_xlabel("Meta-Sum (VQA + IR + TR + NLVR2 + RefCOCO+)")
    ax.set_xlim(0, max(left + [1.0]) * 1.18)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower right", ncol=5)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
