"""Console progress of a training run: one line per ``ray.train.report`` (every
``train.log_every`` steps), printed by Ray Train's controller (``log_to_driver`` forwards it
to the driver's console or the ``ray job`` log; quiet ``vlp`` commands show it without Ray's
prefix, see ``console``). The line names the Train run (``t003-seed1-pretrain``,
``t003-ft-vqa``), so a sweep's concurrent trials read apart."""

from __future__ import annotations

from typing import Any

import ray.train

# window means that are not per-task losses or accuracies
_SHOWN_APART = {"loss", "step", "stage", "lr", "examples_per_s", "input_units_per_s",
                "examples_seen", "input_units_seen", "skipped_batches"}


def progress_line(m: dict[str, Any], total_steps: int, stage_names: list[str],
                  checkpoint: bool = False, run: str = "", job: str = "pretrain") -> str:
    stage = int(m.get("stage", 0))
    name = stage_names[stage] if stage < len(stage_names) else str(stage)
    tasks = sorted(k[:-len("_loss")] for k in m if k.endswith("_loss") and k not in _SHOWN_APART)
    losses = " ".join(f"{t} {m[t + '_loss']:.3f}" for t in tasks)
    line = (f"[vlp {job}] {run + ' ' if run else ''}step {int(m.get('step', 0)):,}/"
            f"{total_steps:,} ({name}) "
            f"loss {m.get('loss', float('nan')):.4f} | {losses} | "
            f"{m.get('examples_per_s', 0):,.1f} ex/s {m.get('input_units_per_s', 0):,.0f} "
            f"units/s | lr {m.get('lr', 0):.2e}")
    if m.get("skipped_batches"):
        line += f" | {int(m['skipped_batches'])} non-finite batches skipped"
    return line + (" | checkpoint" if checkpoint else "")


class ProgressPrinter(ray.train.UserCallback):
    """Prints rank 0's window metrics of every report."""

    def __init__(self, total_steps: int, stage_names: list[str], job: str = "pretrain"):
        self.total_steps = total_steps
        self.stage_names = stage_names
        self.job = job          # the line's prefix: [vlp pretrain] / [vlp finetune]

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]],
                     checkpoint: Any) -> None:
        if metrics:
            print(progress_line(metrics[0], self.total_steps, self.stage_names,
                                checkpoint is not None, _run_name(run_context), self.job),
                  flush=True)


def _run_name(run_context: Any) -> str:
    try:
        return str(run_context.get_run_config().name or "")
    except Exception:      # the name is a courtesy; the line prints without it
        return ""
