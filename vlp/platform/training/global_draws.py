"""The task draws of a global batch stream (``data.stream: global``): by global micro-batch
index, not by a rank's own count, so that a run resumed on another number of workers draws
what the uninterrupted run drew.

The loop needs every rank to train the same task in each micro-batch slot (one forward and
one set of heads per slot: ``step_stats.check_tasks``). On W workers slot j of the stage
holds the global micro-batches jW … jW + W − 1, so tasks are drawn per *group* of ``group``
consecutive global micro-batches (group k draws the sampler's draw k): a group that W
divides keeps every slot inside one group. ``group`` is the run's first number of workers,
kept in the checkpoint: on those W the draws are today's (group k = slot k), and a resume on
M workers draws the same tasks for the same micro-batches wherever M divides it (M < W:
losing nodes). Under the ``summed`` objective every micro-batch trains every task: no draw.
"""

from __future__ import annotations

from typing import Any, Mapping


class GlobalDraws:
    """``next()`` → the task of this rank's next micro-batch slot, drawn by ``sampler.draw``
    for its global group (see the module docstring); ``state_dict`` holds the global index of
    the next slot, the same on every rank and on any world."""

    def __init__(self, sampler: Any, world: int, group: int | None = None):
        self.sampler, self.world = sampler, world
        self.group = group or world
        self.next_micro = 0           # global index of the next slot's first micro-batch
        self._check()

    @property
    def tasks(self) -> list[str]:
        return self.sampler.tasks

    def next(self) -> Any:
        draw = getattr(self.sampler, "draw", None)
        # summed: the same task set every micro-batch (its step counts nothing else)
        task = draw(self.next_micro // self.group) if draw is not None else self.sampler.next()
        self.next_micro += self.world
        return task

    def state_dict(self) -> dict[str, Any]:
        return {**self.sampler.state_dict(), "global_micro": self.next_micro,
                "task_group": self.group}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if "global_micro" not in state:
            raise ValueError("the checkpoint's task draws were counted per worker (data.stream:"
                             " per_worker); this run's stream is global: resume with "
                             "data.stream: per_worker, or start a new run beside it with a "
                             "new run.name (--name)")
        self.sampler.load_state_dict(state)
        self.next_micro, self.group = int(state["global_micro"]), int(state["task_group"])
        self._check()

    def _check(self) -> None:
        if self.group % self.world or self.next_micro % self.world:
            fits = [m for m in range(1, self.group + 1) if self.group % m == 0]
            raise ValueError(
                f"this run draws a task per {self.group} global micro-batches (its first "
                f"scaling.num_workers), which {self.world} workers cannot share slot by slot: "
                f"resume on {', '.join(map(str, fits))} workers")
