"""`vlp doctor`'s findings and the one table they print as (Markdown: it pastes into an
issue or docs/cluster.md as it is), with a line per failure naming the node and what to do.
Plain data, no Ray: what ``doctor.run_doctor`` gathers, and what the unit tests build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vlp.platform.cluster.bus_bandwidth import Measurement

COLUMNS = ("node", "devices", "all-reduce bus bandwidth", "run storage write / read",
           "read-back from another node", "tracking server", "DeepSpeed ops", "training step")


@dataclass
class NodeResult:
    label: str                          # address and short node id; "(head)" on the head
    accelerator: str = "CPU"            # Ray's accelerator_type, else the GPU's name
    gpus: int = 0
    gpu_name: str | None = None
    instance_type: str | None = None
    ranks: int = 0                      # the doctor's ranks placed on it
    within: Measurement | None = None   # the all-reduce among its ranks
    within_note: str = ""               # why there is none
    storage: dict[str, Any] | None = None
    readback: dict[str, Any] | None = None
    readback_from: str = ""
    tracking: dict[str, Any] | None = None
    ops: dict[str, Any] | None = None
    step: dict[str, Any] | None = None
    step_of: str = ""                   # the node whose step stands for this type


@dataclass
class DoctorReport:
    storage: str
    tracking: str
    nodes: list[NodeResult] = field(default_factory=list)
    between: Measurement | None = None
    between_note: str = ""
    failures: list[str] = field(default_factory=list)   # "<node>: <what>; <fix>"

    def fail(self, node: str, error: str, fix: str) -> None:
        self.failures.append(f"{node}: {error}; {fix}")

    def collect(self) -> None:
        """Every failed check of every node into ``failures`` (once)."""
        for n in self.nodes:
            for part in (n.storage, n.readback, n.tracking, n.ops, n.step):
                if part and not part.get("ok", True) and "reported" not in part:
                    part["reported"] = True
                    self.fail(n.label, part["error"], part["fix"])

    @property
    def ok(self) -> bool:
        return not self.failures


def _mb(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:.1f}"


def devices_cell(n: NodeResult) -> str:
    if not n.gpus:
        return f"CPU ({n.instance_type})" if n.instance_type else "CPU"
    where = f", {n.instance_type}" if n.instance_type else ""
    return f"{n.gpus}× {n.gpu_name or 'GPU'} ({n.accelerator}{where})"


def bandwidth_cell(m: Measurement | None, note: str = "") -> str:
    if m is None:
        return note or "—"
    cell = f"{m.gb_per_s:.2f} GB/s ({m.ranks} {m.backend} ranks, {m.nbytes / 2**20:.0f} MiB)"
    if m.expected is None:
        return f"{cell}; expected unknown"
    low = " LOW" if m.low else ""
    return f"{cell}; {m.fraction:.0%} of {m.expected.gb_per_s:g} ({m.expected.link}){low}"


def _failed(part: dict[str, Any] | None) -> bool:
    return part is not None and not part.get("ok", True)


def storage_cell(part: dict[str, Any] | None) -> str:
    if part is None:
        return "—"
    if _failed(part):
        return "FAIL"
    return f"{_mb(part['write_mb_s'])} / {_mb(part['read_mb_s'])} MB/s"


def readback_cell(part: dict[str, Any] | None, writer: str) -> str:
    if part is None:
        return "—"
    return "FAIL" if _failed(part) else f"ok ({writer}'s file)"


def tracking_cell(part: dict[str, Any] | None) -> str:
    if part is None:
        return "—"
    return "FAIL" if _failed(part) else f"ok ({part['ms']:.0f} ms)"


def ops_cell(part: dict[str, Any] | None) -> str:
    if part is None:
        return "—"
    return "FAIL" if _failed(part) else part["ops"]


def step_cell(n: NodeResult) -> str:
    if n.step_of:
        return f"as {n.step_of} (same type)"
    s = n.step
    if s is None:
        return "—"
    if _failed(s):
        return "FAIL"
    mfu = f"MFU {s['mfu']:.2f}" if s.get("mfu") is not None else f"MFU n/a ({s['mfu_why']})"
    return (f"{s['family']}, {s['input_units']:,} units, {s['precision']}: "
            f"{s['step_s'] * 1e3:,.0f} ms, {s['tflops']:.3g} TFLOP/s, {mfu}")


def table(report: DoctorReport) -> list[str]:
    rows = [list(COLUMNS), ["---"] * len(COLUMNS)]
    single = len(report.nodes) < 2
    for n in report.nodes:
        rows.append([n.label, devices_cell(n), bandwidth_cell(n.within, n.within_note),
                     storage_cell(n.storage),
                     "n/a: one node" if single else readback_cell(n.readback, n.readback_from),
                     tracking_cell(n.tracking), ops_cell(n.ops), step_cell(n)])
    rows.append([f"between nodes ({len(report.nodes)})", "",
                 bandwidth_cell(report.between, report.between_note), "", "", "", "", ""])
    return ["| " + " | ".join(cells) + " |" for cells in rows]


def lines(report: DoctorReport) -> list[str]:
    """What `vlp doctor` prints: what it checked, the table, the warnings and failures, and
    a verdict."""
    report.collect()
    out = [f"vlp doctor: {len(report.nodes)} node(s); run storage {report.storage}; "
           f"tracking {report.tracking}", ""]
    out += table(report)
    out.append("")
    for m in [n.within for n in report.nodes] + [report.between]:
        warn = m.warning() if m else None
        if warn:
            out.append(warn)
    out += [f"FAIL {f}" for f in report.failures]
    out.append("vlp doctor: every check passed" if report.ok else
               f"vlp doctor: {len(report.failures)} check(s) failed")
    return out


__all__ = ["COLUMNS", "DoctorReport", "NodeResult", "lines", "table"]
