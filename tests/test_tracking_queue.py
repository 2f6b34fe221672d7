"""Rank 0's MLflow writes never block a training step: with a tracking server that hangs (a
tiny HTTP server that holds every request) or is dead (a closed port), the step loop runs to
its end while nothing is answered, and what was not delivered is kept in the run's storage."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vlp.platform.training.checkpointing import TrainerState
from vlp.contract.config_loader import flatten, to_yaml
from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.pretrain.run import loop_config
from vlp.platform.cluster.ray_session import free_local_port
from vlp.platform.tracking.rank_zero import UNDELIVERED_FILE, RankZeroTracker
from vlp.platform.tracking.background_queue import TrackingQueue

HANG_S = 60


class HangingServer:
    """Accepts every request and answers none until released (or ``HANG_S`` passed)."""

    def __init__(self):
        self.release = threading.Event()
        self.received = 0
        self.answered = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _hold(self):
                outer.received += 1
                outer.release.wait(HANG_S)
                self.send_response(503)
                self.end_headers()
                outer.answered += 1

            do_GET = do_POST = _hold

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.uri = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def stop(self):
        self.release.set()
        self.http.shutdown()


def tracker(uri: str, storage) -> RankZeroTracker:
    cfg = load_experiment_config(data={"run": {"name": "job"}, "train": {"steps": 40},
                                       "optimizer": {"warmup_steps": 1},
                                       "data": {"sources": {"a": {"path": "a"}}}})
    spec = {"enabled": True, "tracking_uri": uri, "experiment": "e", "run_name": "job",
            "key": "k", "storage": str(storage), "deepspeed_config": {}, "queue_limit": 8,
            "metric_window": 1,     # a row per step: each step's delivery can be followed
            "params": flatten(cfg), "config_text": to_yaml(cfg), "tags": {"vlp.job": "pretrain"}}
    return RankZeroTracker(spec, loop_config(cfg))


def step_loop(t: RankZeroTracker, steps: int = 40, every: int = 5) -> list[int]:
    """The training loop's calls to the tracker, as ``train_loop`` makes them."""
    done = []
    t.open(None, fresh=True)
    for step in range(1, steps + 1):
        t.add_step({"step": step, "loss": 1.0 / step, "mlm_loss": 2.0})
        if step % every == 0:
            t.flush({"examples_per_s": 1.0, "input_units_per_s": 2.0, "examples_seen": step,
                     "skipped_batches": 0}, step, checkpoint=f"s3://b/job/checkpoint_{step}")
        done.append(step)
    return done


def undelivered_steps(records) -> set[int]:
    return {row[0] for r in records if r["kind"] == "metrics" for row in r["rows"]}


def test_a_hanging_tracking_server_never_blocks_a_step(tmp_path, monkeypatch):
    # the client waits longer than the server holds: a write that blocked the loop would
    # hold it until the server answers
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", str(2 * HANG_S))
    server = HangingServer()
    try:
        t = tracker(server.uri, tmp_path)
        done = step_loop(t)
        # every step ran while the first request was still held: the loop did not wait
        assert done == list(range(1, 41)) and server.answered == 0
        assert server.received <= 1
        left = t.close(completed=True, state=TrainerState(step=40), timeout_s=1.0)
        assert server.answered == 0          # close gave up waiting, the server still holds
        kept = [json.loads(line) for line in
                (tmp_path / "job" / UNDELIVERED_FILE).read_text().splitlines()]
        assert kept == json.loads(json.dumps(left))
        # bounded: 8 flushes + open + close queued, the oldest given up (kept all the same)
        assert undelivered_steps(kept) == set(range(1, 41))
        assert [r["kind"] for r in kept].count("close") == 1
        assert t.run_id is None
    finally:
        server.stop()


def test_a_dead_tracking_server_loses_nothing_silently(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")   # refused at once, each time
    t = tracker(f"http://127.0.0.1:{free_local_port()}", tmp_path)   # nothing listens there
    assert step_loop(t, steps=20) == list(range(1, 21))
    left = t.close(completed=True, state=TrainerState(step=20), timeout_s=30.0)
    assert undelivered_steps(left) == set(range(1, 21))
    assert (tmp_path / "job" / UNDELIVERED_FILE).is_file()
    out = capsys.readouterr().out
    assert "could not be delivered" in out and str(tmp_path / "job" / UNDELIVERED_FILE) in out


def test_failed_writes_are_retried_in_order_once_the_server_answers():
    calls, up = [], threading.Event()

    def write(i):
        def fn():
            if not up.is_set():
                raise ConnectionError("down")
            calls.append(i)
        return fn

    q = TrackingQueue(max_pending=100)
    q.submit(write(1), {"i": 1})
    q.drain(5)
    up.set()
    q.submit(write(2), {"i": 2})
    q.submit(write(3), {"i": 3})
    assert q.close(timeout_s=5) == []
    assert calls == [2, 1, 3] and q.delivered == 3


@pytest.mark.parametrize("limit", [1, 4])
def test_the_queue_is_bounded_and_gives_up_the_oldest(limit):
    gate, started = threading.Event(), threading.Event()
    q = TrackingQueue(max_pending=limit)
    q.submit(lambda: started.set() or gate.wait(10), {"i": 0})        # holds the thread
    assert started.wait(10)
    for i in range(1, 11):
        q.submit(lambda: None, {"i": i})
    assert q.pending() <= limit + 1
    gate.set()
    left = q.close(timeout_s=5)
    assert [r["i"] for r in left] == list(range(1, 11 - limit))
