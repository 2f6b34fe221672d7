"""The leaderboard's header on downstream protocols: the head or loss each line's finetunes
used (retrieval loss, NLVR2 head, RefCOCO+ head; ``vlp.benchmarks.protocols``).

Meta-Sums finetuned under different protocols compare the protocols as well as the
pre-training (ImageBERT's Table 4 moves Flickr30k IR R@1 by 2.5 between two retrieval
losses), so a table whose lines mix protocols or families says so above the table.

    for line in protocol_header(board.rows): print(line)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

UNKNOWN = "not recorded"


def protocol_header(rows: Sequence[Any]) -> list[str]:
    """Lines to print above the table: the one protocol every line used, or, when lines
    differ, a warning and which lines used which."""
    if not rows:
        return []
    groups: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        groups.setdefault((r.family or UNKNOWN, r.protocol or UNKNOWN), []).append(r.trial)
    if len(groups) == 1:
        (family, protocol), = groups
        return [f"downstream protocol (every line): {protocol}; family {family}"]
    protocols = {p for _, p in groups}
    if len(protocols) == 1:
        families = ", ".join(sorted({f for f, _ in groups}))
        return [f"downstream protocol (every line): {protocols.pop()}; families {families}"]
    out = ["WARNING: these lines mix downstream protocols: a Meta-Sum gap between them "
           "measures the finetuning protocol as well as the pre-training (set the finetune's "
           "protocol: uniter for one protocol across families)"]
    for (family, protocol), trials in groups.items():
        out.append(f"  {', '.join(trials)}: family {family}; protocol {protocol}")
    return out
