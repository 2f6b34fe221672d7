"""A sweep trial's progress: per replicate (training seed) the last stage it finished, its
pretraining checkpoint, its Meta-Sum parts and the compute spent; the trial's figures are
gathered from its replicates'. Saved in every Tune checkpoint (``STATE_FILE``) and, after each
finished (replicate, stage), in the trial folder's ``REPLICATES_FILE``: a restored trial
resumes from whichever is further on. ``ATTEMPTS_FILE`` gets a line per start of the trial.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vlp.platform.cluster.run_storage import open_location

STATE_FILE = "sweep_trial.json"
REPLICATES_FILE = "replicates.json"  # per-replicate progress, written after each (replicate, stage)
ATTEMPTS_FILE = "attempts.jsonl"     # one line per start of the trial function (resume audit)


@dataclass
class Replicate:
    seed: int
    done: int = -1                    # last stage this replicate finished
    checkpoint: str | None = None     # its pretraining checkpoint (None: no pretraining)
    scores: dict[str, float] = field(default_factory=dict)   # its Meta-Sum parts so far
    steps: int = 0
    seconds: float = 0.0
    pretrain_loss: float | None = None


@dataclass
class TrialState:
    done: int = -1                    # last stage every replicate finished (-1: none)
    scores: dict[str, float] = field(default_factory=dict)   # Meta-Sum parts so far (mean)
    steps: int = 0                    # optimizer steps spent: pretraining + finetunes, all seeds
    seconds: float = 0.0              # wall time of the finished (replicate, stage)s
    pretrain_loss: float | None = None    # mean over replicates
    mlflow_run_id: str | None = None
    replicates: list[Replicate] = field(default_factory=list)

    def gather(self) -> None:
        """The trial's figures from its replicates': means of the parts every replicate has,
        sums of the compute."""
        reps = self.replicates
        self.done = min((r.done for r in reps), default=-1)
        self.steps = sum(r.steps for r in reps)
        self.seconds = sum(r.seconds for r in reps)
        parts = set.intersection(*(set(r.scores) for r in reps)) if reps else set()
        self.scores = {p: sum(r.scores[p] for r in reps) / len(reps) for p in sorted(parts)}
        losses = [r.pretrain_loss for r in reps if r.pretrain_loss is not None]
        self.pretrain_loss = sum(losses) / len(losses) if losses and len(losses) == len(reps) \
            else None

    @classmethod
    def from_json(cls, data: dict[str, Any], first_seed: int = 0) -> "TrialState":
        reps = [Replicate(**r) for r in data.pop("replicates", [])]
        if not reps and data.get("done", -1) >= 0:
            # a checkpoint written before replicates: one trial state is its one replicate
            reps = [Replicate(first_seed, data["done"], data.get("checkpoint"),
                              dict(data.get("scores") or {}), int(data.get("steps", 0)),
                              float(data.get("seconds", 0.0)), data.get("pretrain_loss"))]
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known}, replicates=reps)


def load_state(checkpoint: Any, first_seed: int = 0) -> TrialState:
    if checkpoint is None:
        return TrialState()
    with checkpoint.as_directory() as folder:
        return TrialState.from_json(json.loads(Path(folder, STATE_FILE).read_text()),
                                    first_seed)


def resume_state(checkpoint: Any, trial_dir: str, seeds: list[int]) -> TrialState:
    """The state of Tune's last checkpoint, or the replicates file when it is further on
    (replicates finished after the last report); replicates missing from both start fresh."""
    state = load_state(checkpoint, seeds[0])
    folder = open_location(trial_dir)
    if folder.exists(REPLICATES_FILE):
        saved = TrialState.from_json(json.loads(folder.read_text(REPLICATES_FILE)))
        if _progress(saved.replicates) > _progress(state.replicates):
            state.replicates = saved.replicates
    have = {r.seed for r in state.replicates}
    state.replicates += [Replicate(seed) for seed in seeds if seed not in have]
    state.replicates = [r for r in state.replicates if r.seed in seeds]
    state.gather()
    return state


def _progress(replicates: list[Replicate]) -> int:
    """Stages finished, summed over the replicates (an absent replicate has finished none:
    one replicate done with stage 0 is further on than no Tune checkpoint at all)."""
    return sum(r.done + 1 for r in replicates)


def save_replicates(trial_dir: str, state: TrialState) -> None:
    open_location(trial_dir).write_text(json.dumps(asdict(state)), REPLICATES_FILE)


def log_attempt(trial_dir: str, state: TrialState) -> None:
    """One line more in the attempts file (rewritten whole: object stores cannot append; one
    attempt of a trial runs at a time)."""
    folder = open_location(trial_dir)
    before = folder.read_text(ATTEMPTS_FILE) if folder.exists(ATTEMPTS_FILE) else ""
    folder.write_text(before + json.dumps({"time": time.time(), "pid": os.getpid(),
                                           "resumed_after_stage": state.done}) + "\n",
                      ATTEMPTS_FILE)
