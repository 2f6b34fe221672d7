"""``ray.train.report`` on a thread of its own, so the training step never waits for it.

Ray Train hands a report to its controller through a queue of one slot, which the controller
empties when it polls the workers (every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, 2 s by
default). A worker that reports again before that poll blocks in ``report`` until it comes:
on the calling thread, every report of a loop whose steps are shorter than the poll interval
would cost up to the whole interval. Here the training thread queues the report and goes on;
a thread makes the calls in order (every rank the same sequence: Ray's report is a collective
across the ranks). A report with a checkpoint is queued the same way, and the training thread
then waits for it (``drain``): a checkpoint is persisted before training goes on, as before,
and checkpoints are rare.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable

_STOP = object()


class Reporter:
    """``submit(metrics, checkpoint_dir, dir_name)`` queues a report; ``drain()`` waits for
    every report queued so far and raises the first error of the thread; ``close()`` stops
    it. ``report_fn(metrics, checkpoint_dir, dir_name)`` makes the call (``ray_report``)."""

    def __init__(self, report_fn: Callable[[dict[str, Any], str | None, str | None], None]):
        self._report = report_fn
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vlp-report", daemon=True)
        self._thread.start()

    def submit(self, metrics: dict[str, Any], checkpoint_dir: str | None = None,
               dir_name: str | None = None) -> None:
        self._raise()
        self._queue.put((metrics, checkpoint_dir, dir_name))

    def drain(self) -> None:
        self._queue.join()
        self._raise()

    def close(self, timeout: float | None = None) -> None:
        """After the reports queued so far (``timeout`` bounds the wait on an error path)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError("ray.train.report failed on the report thread") from self._error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                metrics, folder, name = item
                try:
                    if self._error is None:   # after a failure, later reports are dropped
                        self._report(metrics, folder, name)
                except BaseException as e:   # the training thread raises it at its next call
                    self._error = e
            finally:
                self._queue.task_done()


def ray_report(metrics: dict[str, Any], checkpoint_dir: str | None,
               dir_name: str | None) -> None:
    import ray.train

    if checkpoint_dir is None:
        ray.train.report(metrics)
    else:
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(checkpoint_dir),
                         checkpoint_dir_name=dir_name)
