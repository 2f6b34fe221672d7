"""Tracking writes off the training thread: one daemon thread runs them in order from a
bounded queue, so a slow or dead MLflow server never holds up a step (and every rank waiting
in the next collective for rank 0).

    q = TrackingQueue(max_pending=256)
    q.submit(lambda: run.log_metric_rows(rows), {"kind": "metrics", "rows": rows})
    undelivered = q.close(timeout_s=30)      # records of what never reached the server

Each call carries a JSON-able record of what it writes. A call that fails is kept and tried
again after the next call that succeeds (a server that comes back gets the rows it missed),
at most ``MAX_ATTEMPTS`` times. When more than ``max_pending`` calls wait, the oldest is given
up at once (its record kept). ``close`` waits up to its timeout for the queue to empty and
returns the records of everything not delivered — failed, given up, still queued, or in
flight when time ran out — for the caller to keep in the run's storage.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

MAX_ATTEMPTS = 3


class TrackingQueue:
    def __init__(self, max_pending: int = 256, name: str = "vlp-tracking"):
        self.max_pending = max_pending
        self._queue: collections.deque = collections.deque()
        self._retry: list[list[Any]] = []       # [fn, record, attempts] failed, to retry
        self._given_up: list[dict[str, Any]] = []
        self._in_flight: dict[str, Any] | None = None
        self._cv = threading.Condition()
        self._closing = False
        self.delivered = 0
        self.errors: list[str] = []             # first few error messages, for the report
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], record: dict[str, Any]) -> None:
        """Queue ``fn``; never blocks (beyond a lock held for list operations)."""
        with self._cv:
            self._queue.append([fn, record, 0])
            while len(self._queue) > self.max_pending:
                self._given_up.append(self._queue.popleft()[1])
            self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return len(self._queue) + len(self._retry) + (self._in_flight is not None)

    def drain(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or in flight (failed calls may remain); True if so."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and self._in_flight is None,
                                     timeout=timeout_s)

    def close(self, timeout_s: float) -> list[dict[str, Any]]:
        """Drain for at most ``timeout_s``, retry the failed calls once more in that time,
        stop the thread, and return the records of what was not delivered."""
        self.drain(timeout_s)
        with self._cv:
            if self._retry and self._in_flight is None:
                self._queue.extend(self._retry)
                self._retry = []
                self._cv.notify()
        self.drain(timeout_s)
        with self._cv:
            self._closing = True
            left = ([r for _, r, _ in self._retry] + self._given_up
                    + [r for _, r, _ in self._queue]
                    + ([self._in_flight] if self._in_flight is not None else []))
            self._queue.clear()
            self._retry, self._given_up = [], []
            self._cv.notify_all()
        return left

    def _work(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or self._closing)
                if self._closing:
                    return
                item = self._queue.popleft()
                self._in_flight = item[1]
            fn, record, attempts = item
            try:
                fn()
                ok = True
            except Exception as e:  # tracking must never reach the training thread
                ok = False
                if len(self.errors) < 5:
                    self.errors.append(f"{type(e).__name__}: {str(e)[:300]}")
            with self._cv:
                self._in_flight = None
                if ok:
                    self.delivered += 1
                    # the server answers again: what failed before goes first
                    self._queue.extendleft(reversed(self._retry))
                    self._retry = []
                elif attempts + 1 < MAX_ATTEMPTS:
                    self._retry.append([fn, record, attempts + 1])
                else:
                    self._given_up.append(record)
                self._cv.notify_all()
