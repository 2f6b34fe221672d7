"""The training objective of a micro-batch: one task drawn per micro-batch (``sampled``:
UNITER's, VL-BERT's) or every task's loss on one example set (``summed``: ImageBERT's "four
tasks simultaneously", SOHO's L = L_MLM + L_MVM + L_ITM).

Under ``summed`` the sampler draws a ``TaskSet`` (every task with a positive ratio and its
loss weight: the ratios scaled to a mean of 1, ``task_sampler.loss_weights``), the batch source
builds a batch per task from one example set (``TASK_BATCHES``), and ``forward`` runs the model
once per task and returns each task's outputs under their own keys, as the sampled objective
reports them, with ``loss`` = Σ_t weight_t · loss_t: the loop's one backward. A forward group
(``TaskSet.groups``: tasks sharing one batch) is one forward with every member's head. Running
statistics (SOHO's visual dictionary, BatchNorm) move on the first of those forwards only,
and SOHO's images go through the CNN and the dictionary once (the other tasks reuse it).
The cross-rank check compares a task set by one id of its own (``task_id``).
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import nullcontext
from typing import Any, Mapping

import torch

from vlp.contract.batch_spec import TASK_BATCHES
from vlp.datasets.batching.task_sampler import SummedTasks, forward_groups, loss_weights
from vlp.models.running_stats import images_encoded_once, statistics_frozen

OBJECTIVES = ("sampled", "summed")


def build_sampler(components: Any, mix: dict[str, float], seed: int, objective: str,
                  groups: tuple[tuple[str, ...], ...] = ()) -> Any:
    """The stage's sampler: the components' own (``sampled``) or every task (``summed``,
    ``groups``: the tasks that share one batch and one forward)."""
    if objective == "sampled":
        return components.build_task_sampler(mix, seed)
    if objective == "summed":
        return SummedTasks(mix, seed, known=list(mix), groups=groups)
    raise ValueError(f"train.objective={objective!r}: expected one of {', '.join(OBJECTIVES)}")


def describe(objective: str, mixes: list[dict[str, float]]) -> str:
    """One log line: what a micro-batch trains, and the loss weights of each stage."""
    if objective != "summed":
        return "objective sampled: one task per micro-batch, drawn by mix ratio"
    weights = "; ".join(", ".join(f"{t} {w:.3g}" for t, w in loss_weights(m).items())
                        for m in mixes)
    return (f"objective summed: every task's loss on each micro-batch's examples, one "
            f"backward; loss weights {weights}")


def describe_groups(objective: str, groups: tuple[tuple[str, ...], ...],
                    mixes: list[dict[str, float]]) -> str:
    """The forward groups' log line, each group as the stages' mixes hold it ('' when there
    are none or the objective is sampled)."""
    groups = tuple(dict.fromkeys(
        g for m in mixes for g in forward_groups(groups, [t for t, r in m.items() if r > 0])))
    if objective != "summed" or not groups:
        return ""
    return ("one batch and one forward for " + "; ".join(" + ".join(g) for g in groups)
            + " (each modality masked once: train.forward_groups)")


def task_id(task: str | tuple[str, ...], task_ids: Mapping[str, int]) -> int:
    """The id the ranks compare: a task's own, or for a task set one past every task's id
    plus a bit per member (two different sets never share an id)."""
    if isinstance(task, str):
        return task_ids[task]
    return len(task_ids) + sum(1 << task_ids[t] for t in task)


def forward(engine: Any, batch: Mapping[str, Any], task: str | tuple[str, ...]
            ) -> dict[str, torch.Tensor]:
    """The model's outputs for a micro-batch, with ``loss`` the tensor to back-propagate."""
    if isinstance(task, str):
        return _checked(engine(batch, task=task), task)
    weights = task.weights
    per_task = batch[TASK_BATCHES]
    out: dict[str, torch.Tensor] = {}
    shared: dict[str, list[torch.Tensor]] = defaultdict(list)
    total = None
    model = getattr(engine, "module", engine)   # DeepSpeed's engine wraps the model
    forwards = task.forwards() if hasattr(task, "forwards") else [(t,) for t in task]
    with images_encoded_once(model):   # SOHO: the set's images through the CNN once
        for i, group in enumerate(forwards):
            t = group[0]
            # running statistics (SOHO's dictionary, BatchNorm) move once per example set,
            # on its first forward, as when each image is forwarded once per batch
            with statistics_frozen(model) if i else nullcontext():
                if len(group) == 1:
                    o = _checked(engine(per_task[t], task=t), t)
                    term = weights[t] * o["loss"]
                else:   # a forward group: one forward, every member's head, weighted inside
                    o = _checked(engine(per_task[t], task=group,
                                        weights={g: weights[g] for g in group}), t)
                    term = o["loss"]
            total = term if total is None else total + term
            for k, v in o.items():
                if k != "loss":
                    shared[k].append(v)
    for k, vs in shared.items():   # each task's keys are its own; a backbone metric averages
        out[k] = vs[0] if len(vs) == 1 else torch.stack([v.detach().float() for v in vs]).mean()
    out["loss"] = total
    return out


def _checked(out: dict[str, torch.Tensor], task: str) -> dict[str, torch.Tensor]:
    if "loss" not in out:
        raise KeyError(f"the model returned {sorted(out)} for task {task!r}: a 'loss' "
                       "entry (the total) is required")
    return out
