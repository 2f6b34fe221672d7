"""Ray's report on a thread of its own: the training thread never waits for a metrics report
(Ray Train blocks a worker's report until its controller's next poll, every 2 s), reports
keep their order, a failed report is raised on the training thread, and a checkpoint report
is waited for (persisted before training goes on)."""

from __future__ import annotations

import threading
import time

import pytest

from vlp.platform.training.checkpointing import TrainerState
from vlp.platform.training.reporter import Reporter
from vlp.platform.training.step_stats import ReportWindow


class SlowRay:
    """A stand-in for ``ray.train.report`` that blocks until released, as a report does until
    Ray's controller polls."""

    def __init__(self):
        self.release = threading.Event()
        self.calls: list[tuple] = []

    def __call__(self, metrics, folder, name):
        assert self.release.wait(10)
        self.calls.append((metrics["step"], folder, name))


def test_metrics_reports_do_not_wait_and_keep_their_order():
    ray = SlowRay()
    r = Reporter(ray)
    t0 = time.perf_counter()
    for step in range(1, 4):
        r.submit({"step": step})
    assert time.perf_counter() - t0 < 1.0 and ray.calls == []   # nothing waited for Ray
    ray.release.set()
    r.drain()
    assert ray.calls == [(1, None, None), (2, None, None), (3, None, None)]
    r.close()


def test_a_failed_report_is_raised_on_the_training_thread():
    def broken(metrics, folder, name):
        raise ValueError("controller gone")

    r = Reporter(broken)
    r.submit({"step": 1})
    with pytest.raises(RuntimeError, match="report thread") as e:
        r.drain()
    assert isinstance(e.value.__cause__, ValueError)
    with pytest.raises(RuntimeError):
        r.submit({"step": 2})
    r.close()


def loop_worker(ray, interval: int):
    from vlp.platform.training.loop import _Worker

    class Cfg:     # the fields _maybe_report reads
        checkpoint_interval = interval

        @staticmethod
        def stage_steps():
            return [("pretrain", 100)]

        class train:
            log_every = 1

    class Prefetch:
        def state_dict(self):
            return {"sampler": {}, "source": {}}

    w = object.__new__(_Worker)
    w.cfg, w.tracker, w.prefetch, w.engine = Cfg, None, Prefetch(), None
    w.stage_ends, w.stop_at, w.rank = [100], 100, 0
    w.reporter = Reporter(ray)
    return w


def test_the_loop_does_not_wait_for_a_metrics_report_but_for_a_checkpoint(monkeypatch):
    from vlp.platform.training import checkpointing

    ray = SlowRay()
    w = loop_worker(ray, interval=3)
    state, window = TrainerState(step=1), ReportWindow()
    t0 = time.perf_counter()
    w._maybe_report(state, window)                 # step 1: metrics only
    state.step = 2
    w._maybe_report(state, window)
    assert time.perf_counter() - t0 < 1.0 and ray.calls == []

    saved = []
    monkeypatch.setattr(checkpointing, "save", lambda engine, folder, *a, **k: saved.append(
        folder))
    state.step = 3                                  # a checkpoint step: waits for Ray
    done = threading.Event()
    t = threading.Thread(target=lambda: (w._maybe_report(state, window), done.set()))
    t.start()
    assert not done.wait(0.5)                       # still waiting for the report
    ray.release.set()
    assert done.wait(10)
    t.join()
    assert [c[0] for c in ray.calls] == [1, 2, 3]
    assert ray.calls[2][1:] == (saved[0], "checkpoint_" + checkpointing.step_tag(3))
    w.reporter.close()
