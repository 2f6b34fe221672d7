"""The input path that runs ahead of the step, and the loop's per-step bookkeeping.

The prefetching source (a thread, look-ahead 3) yields exactly the batches of the synchronous
one — same tasks, same tensors, same examples / input units — and its checkpoint state, taken
while the thread is ahead, resumes at the first batch the loop has not used. The loop makes one
statistics all-reduce per optimizer step, and an fp16 step whose update DeepSpeed skipped for
overflow moves neither the step counter nor the schedule (a stand-in engine that behaves as
DeepSpeed does: no optimizer or scheduler step on overflow; fp16 does not run on CPU).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from vlp.platform.training.checkpointing import TrainerState
from vlp.platform.training.engine import WarmupLinearDecay
from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.pretrain.run import loop_config
from vlp.platform.training.prefetch import Prefetcher
from vlp.platform.training.step_stats import BOOKKEEPING
from vlp.testing.toy import ToyBatchSource, ToyModel, ToyTaskSampler

MIX = {"mlm": 1.0, "itm": 1.0, "mrfr": 1.0}
CPU = torch.device("cpu")


def toy_pair(seed: int = 7):
    return ToyTaskSampler(MIX, seed), ToyBatchSource(16, seed, rank=0, stage_index=0)


def take(prefetch: Prefetcher, n: int, needed: int = 100):
    return [prefetch.next(needed) for _ in range(n)]


def same_items(a, b) -> bool:
    return all(x.task == y.task and x.examples == y.examples
               and x.input_units == y.input_units and x.batch.keys() == y.batch.keys()
               and all(torch.equal(x.batch[k], y.batch[k]) for k in x.batch)
               for x, y in zip(a, b, strict=True))


def same_state(a: dict, b: dict) -> bool:
    return (a["sampler"] == b["sampler"] and a["source"]["calls"] == b["source"]["calls"]
            and torch.equal(a["source"]["gen"], b["source"]["gen"]))


def test_prefetching_source_yields_the_synchronous_batches_and_resume_point():
    sync = Prefetcher(*toy_pair(), depth=0, device=CPU)
    ahead = Prefetcher(*toy_pair(), depth=3, device=CPU)
    try:
        first_sync, first_ahead = take(sync, 5), take(ahead, 5)
        assert same_items(first_sync, first_ahead)
        deadline = time.monotonic() + 30
        while ahead._produced < 8 and time.monotonic() < deadline:   # the thread runs ahead
            time.sleep(0.01)
        assert ahead._produced == 8 and ahead._consumed == 5
        state = ahead.state_dict()
        assert same_state(state, sync.state_dict())      # where the loop is, not the thread
        rest_sync, rest_ahead = take(sync, 5), take(ahead, 5)
        assert same_items(rest_sync, rest_ahead)
    finally:
        ahead.close()
    sampler, source = toy_pair()
    sampler.load_state_dict(state["sampler"])
    source.load_state_dict(state["source"])
    resumed = Prefetcher(sampler, source, depth=2, device=CPU)
    try:
        assert same_items(take(resumed, 5), rest_sync)   # resumes at the first unused batch
    finally:
        resumed.close()


def test_look_ahead_stops_at_the_batches_the_stage_needs():
    ahead = Prefetcher(*toy_pair(), depth=4, device=CPU)
    for needed_after in (2, 1, 0):
        ahead.next(needed_after)
    ahead.close()
    assert ahead._produced == 3      # nothing drawn past the stage's last micro-batch


def test_bookkeeping_stays_on_the_host_and_floats_take_the_compute_dtype():
    item = Prefetcher(*toy_pair(), depth=0, device=CPU, dtype=torch.bfloat16).next()
    assert isinstance(item.examples, int) and isinstance(item.input_units, int)
    assert item.batch["x"].dtype == torch.bfloat16 and item.batch["y_cls"].dtype == torch.long
    assert item.batch["num_examples"].dtype == torch.long


class DeepSpeedLikeEngine:
    """What the loop uses of a DeepSpeed engine; on an overflowing optimizer step (the
    ``overflow_at``-th) neither the optimizer nor the LR scheduler steps, as in DeepSpeed's
    ``_take_model_step``."""

    def __init__(self, model, gas: int, overflow_at: tuple[int, ...] = ()):
        self.module, self.gas, self.overflow_at = model, gas, overflow_at
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, WarmupLinearDecay(2, 10))
        self.micro = self.attempts = 0
        self.applied = True

    def __call__(self, batch, task):
        return self.module(batch, task=task)

    def backward(self, loss):
        loss.backward()

    def step(self):
        self.micro += 1
        if self.micro % self.gas:
            return
        self.attempts += 1
        self.applied = self.attempts not in self.overflow_at
        if self.applied:
            self.opt.step()
            self.sched.step()
        self.opt.zero_grad()

    def was_step_applied(self):
        return self.applied

    def get_lr(self):
        return self.sched.get_last_lr()


def worker(gas: int, overflow_at: tuple[int, ...] = ()):
    from vlp.platform.training.loop import _Worker

    torch.manual_seed(0)
    cfg = loop_config(load_experiment_config(data={   # what the loop gets: a LoopConfig
        "data": {"sources": {"a": {"path": "/x"}}}, "tasks": MIX,
        "train": {"steps": 10, "grad_accum": gas}, "optimizer": {"warmup_steps": 2}}))
    w = object.__new__(_Worker)
    w.cfg, w.rank, w.world = cfg, 0, 1
    w.task_ids = {t: i for i, t in enumerate(MIX)}
    w.stage_ends, w.stop_at, w.shape, w.overflow_skips = [10], 10, None, 0
    w.engine = DeepSpeedLikeEngine(ToyModel(list(MIX)), gas, overflow_at)
    w.prefetch = Prefetcher(*toy_pair(), depth=2, device=CPU)
    return w


def run_steps(w, steps: int):
    state, records, calls = TrainerState(), [], 0
    while state.step < steps:
        records.append(w._optimizer_step(state))
        calls += 1
    w.prefetch.close()
    return state, records, calls


def test_one_stats_all_reduce_per_optimizer_step(one_rank, monkeypatch):
    reduces = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, *a, **k: reduces.append(1) or real(t, *a,
                                                                                         **k))
    state, records, _ = run_steps(worker(gas=3), 4)
    assert len(reduces) == 4                     # 12 micro-batches, 4 optimizer steps
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert state.examples_seen == sum(r["global_batch_examples"] for r in records) > 0
    assert all(len(r["tasks"]) == 3 and r["data_wait_s"] >= 0 for r in records)
    # each step's own wall time, measured on the worker (loop_overhead.py reads it)
    assert all(r["data_wait_s"] <= r["step_time_s"] < 60 for r in records)
    # and the worker process's CPU time in each step (every thread): loop_overhead.py too
    assert all(0 < r["process_cpu_s"] < 60 for r in records)
    assert "process_cpu_s" in BOOKKEEPING          # not averaged as a model output


def test_an_fp16_overflow_skip_moves_neither_the_step_nor_the_schedule(one_rank):
    _, clean, _ = run_steps(worker(gas=2), 4)
    state, records, attempts = run_steps(worker(gas=2, overflow_at=(2,)), 4)
    assert attempts == 5 and records[1] is None and state.step == 4
    applied = [r for r in records if r is not None]
    assert [r["step"] for r in applied] == [1, 2, 3, 4]
    # the redone step 2 trains at step 2's learning rate, and so on: the schedule did not move
    assert [r["lr"] for r in applied] == [r["lr"] for r in clean]
