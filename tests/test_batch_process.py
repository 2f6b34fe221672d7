"""Batches built in a process of their own (``train.batch_builder: process``).

The real batcher on the tiny world, in a spawned process: the same batches as the
synchronous path, the same resume point, the stream read and the epoch sync made in this
process (a real gloo all-reduce), and the builder's failures — a bad block, an exception, the
process killed — raised here with their cause.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from vlp.datasets.stream.data_config import DataConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches, local_blocks
from vlp.datasets.batching.pretrain_batches import PretrainBatches
from vlp.models import create_model
from vlp.platform.pretrain.components import AnyRank
from vlp.platform.training.packed_batch import pack, unpack
from vlp.platform.training.prefetch import Prefetcher
from vlp.testing.toy import InOrderSampler

CPU = torch.device("cpu")
TASKS = ["mlm", "itm", "mrfr", "mrc-kl"]


@pytest.fixture(scope="module")
def plan(tiny_world):
    _, spec, _ = create_model("uniter-tiny", TASKS, region_feat_dim=64, num_classes=17)
    cfg = DataConfig.for_model(spec, (SourceConfig("coco", str(tiny_world / "images" / "coco")),),
                               batch_units=1024, bucket_window=64)
    return plan_data(cfg, TASKS, model=spec)


def same(a, b) -> None:
    for x, y in zip(a, b, strict=True):
        assert (x.task, x.examples, x.input_units, x.real_units) == \
            (y.task, y.examples, y.input_units, y.real_units)
        assert x.batch.keys() == y.batch.keys()
        for k, v in x.batch.items():
            if isinstance(v, torch.Tensor):
                assert v.dtype == y.batch[k].dtype and torch.equal(v, y.batch[k]), k
            else:
                assert v == y.batch[k], k


def take(prefetch, n):
    return [prefetch.next(1000) for _ in range(n)]


def test_a_process_builds_the_synchronous_batches_and_resumes_where_the_loop_is(plan):
    sync = Prefetcher(InOrderSampler(TASKS), local_batches(plan), depth=0, device=CPU)
    want = take(sync, 24)    # past the ends of two epochs of the tiny world's coco shard
    assert sync.source.epoch >= 2
    built = Prefetcher(InOrderSampler(TASKS), local_batches(plan), depth=3, device=CPU,
                       builder="process")
    try:
        first = take(built, 12)
        state = built.state_dict()     # the builder is ahead: the state is the loop's
        assert state["sampler"] == {"i": 12}
        same(first + take(built, 12), want)
    finally:
        built.close()
    assert not built._process._proc.is_alive()

    sampler, source = InOrderSampler(TASKS), local_batches(plan)
    sampler.load_state_dict(state["sampler"])
    source.load_state_dict(state["source"])
    resumed = Prefetcher(sampler, source, depth=2, device=CPU, builder="process")
    try:
        # the stage's last three micro-batches: the builder draws none past them
        got = take(resumed, 9) + [resumed.next(needed_after) for needed_after in (2, 1, 0)]
        same(got, want[12:])
    finally:
        resumed.close()
    assert resumed._produced == 12   # not 14: the look-ahead is the loop's


class CountingSync:
    """The real epoch sync (an all-reduce on a gloo group of its own), counted here."""

    def __init__(self):
        self.sync, self.calls = AnyRank(), 0

    def __call__(self, exhausted: bool) -> bool:
        self.calls += 1
        return self.sync(exhausted)


def test_the_stream_and_the_epoch_sync_stay_in_the_training_process(plan, one_rank):
    counted = {}

    def source(sync):
        blocks = local_blocks(plan)

        def read(epoch):
            counted.setdefault(id(sync), []).append(epoch)
            yield from blocks(epoch)
        return PretrainBatches(plan, read, epoch_sync=sync)

    thread_sync, process_sync = CountingSync(), CountingSync()
    on_thread = Prefetcher(InOrderSampler(TASKS), source(thread_sync), depth=2, device=CPU)
    built = Prefetcher(InOrderSampler(TASKS), source(process_sync), depth=2, device=CPU,
                       builder="process")
    try:
        want, got = take(on_thread, 24), take(built, 24)
    finally:
        on_thread.close()
        built.close()
    same(got, want)
    # one all-reduce per batch drawn, made here for the builder; the epochs read here as well
    assert process_sync.calls == built._produced >= 24
    assert thread_sync.calls == on_thread._produced >= 24
    assert counted[id(process_sync)][:2] == counted[id(thread_sync)][:2] == [0, 1]


def test_three_builder_processes_build_the_batches_of_one_in_order(plan, one_rank,
                                                                   monkeypatch):
    """``train.batch_builders: auto`` with three spare cores: one process builds at first,
    one more whenever the loop waited on data over the last batches; each builds the batches
    the pool gives it and passes over the others. The stream is read here once and sent to
    all three, the epoch sync runs once per batch (whichever member asks first), and the
    batches are the synchronous ones, in order."""
    from vlp.platform.training import builder_pool, prefetch

    monkeypatch.setattr(builder_pool, "auto_builders", lambda: 3)
    monkeypatch.setattr(prefetch, "AutoGrow", lambda pool: builder_pool.AutoGrow(pool, 4))
    reads = []
    blocks = local_blocks(plan)

    def read(epoch):   # a stream that stays here (as a Ray Data shard does)
        reads.append(epoch)
        yield from blocks(epoch)

    want = take(Prefetcher(InOrderSampler(TASKS), local_batches(plan), depth=0, device=CPU), 24)
    sync = CountingSync()
    built = Prefetcher(InOrderSampler(TASKS), PretrainBatches(plan, read, epoch_sync=sync),
                       depth=2, device=CPU, builder="process", builders="auto")
    try:
        got = take(built, 24)
        state = built.state_dict()
    finally:
        built.close()
    same(got, want)
    assert built._process.count == 3 and built._process.active > 1   # the loop waited
    assert all(not m._proc.is_alive() for m in built._process.members)
    # once per batch drawn (a member passing over the others' may be ahead of the loop), not
    # once per member
    assert 24 <= sync.calls <= built._target
    assert reads[:3] == [0, 1, 2] and len(set(reads)) == len(reads)   # each epoch read once
    assert state["sampler"] == {"i": 24}


def test_two_builder_processes_each_build_half_the_batches(plan):
    """The pool splits the work (counts, not times: docs/benchmarks.md has the rate per
    builder count): of 12 batches, member k builds batches k, k + 2, … and passes over the
    others, so each builds 6, as its own batch count says."""
    from vlp.platform.training.builder_pool import BuilderPool

    pool = BuilderPool(InOrderSampler(TASKS), local_batches(plan), 2)
    owners, built = [], {}
    pool.start()
    try:
        pool.set_target(12)
        for _ in range(12):
            _, _, slot, _, after = pool.receive()
            owners.append(slot[0])
            built[slot[0]] = after["source"]["stats"]["batches"]
            pool.release(slot)
    finally:
        pool.close()
    assert owners == [0, 1] * 6
    assert built == {0: 6, 1: 6}


def test_a_pool_shares_out_the_reading_and_builds_the_batches_of_one(plan, tmp_path):
    """Over the local reader (which reads anywhere), a pool of three: each epoch's files are
    dealt out, member k reading files k, k + 3, … and sharing each block with the others in
    shared memory, so every file is read once an epoch in the pool instead of once per member
    (docs/benchmarks.md: the CPU it saves); the batches are still the synchronous ones, in
    order, past two epochs' ends."""
    from collections import Counter

    from vlp.testing.read_log import LoggedReads, read_lines

    log = tmp_path / "reads.log"
    want = take(Prefetcher(InOrderSampler(TASKS), local_batches(plan), depth=0, device=CPU), 24)
    built = Prefetcher(InOrderSampler(TASKS),
                       PretrainBatches(plan, LoggedReads(local_blocks(plan), log)),
                       depth=2, device=CPU, builder="process", builders=3)
    try:
        got = take(built, 24)
        pids = [m._proc.pid for m in built._process.members]
    finally:
        built.close()
    same(got, want)
    reads = read_lines(log)
    files = len(local_blocks(plan).parts(0))
    assert files == 2   # the tiny world's coco shards
    epochs = {e for _, e, _ in reads}
    assert {0, 1, 2} <= epochs
    assert set(Counter((e, f) for _, e, f in reads).values()) == {1}   # once in the pool
    for pid, epoch, name in reads:   # by the member dealt the file
        order = [Path(f).name for f, _ in local_blocks(plan).parts(epoch)]
        assert pid == pids[order.index(name) % 3]


def test_a_file_that_fails_in_one_member_fails_the_pool_with_its_cause(plan, tmp_path):
    """Member 1 fails reading its file: member 0, which needs that file's blocks, fails too,
    and the loop gets the reading error with the file and the member named (not a refused
    connection: a failed builder waits for the stop before it exits, so the batch it sent
    just before can still be taken)."""
    from vlp.testing.read_log import LoggedReads

    second = Path(local_blocks(plan).parts(0)[1][0]).name   # member 1's to read
    built = Prefetcher(InOrderSampler(TASKS),
                       PretrainBatches(plan, LoggedReads(local_blocks(plan), tmp_path / "log",
                                                         fail=second)),
                       depth=2, device=CPU, builder="process", builders=2)
    try:
        with pytest.raises(RuntimeError, match="prefetch process failed") as info:
            take(built, 24)
    finally:
        built.close()
    text = str(info.value.__cause__)   # the member that failed named, and why
    assert f"{second} (part 1 of epoch 0) failed in builder process 1" in text
    assert "column 'features' missing" in text


def test_builders_are_added_while_the_loop_waits_on_data(plan):
    from vlp.platform.training.builder_pool import AutoGrow, BuilderPool

    pool = BuilderPool(InOrderSampler(TASKS), local_batches(plan), 3, active=1)   # not started
    grow = AutoGrow(pool, window=4, wait_share=0.05)
    for _ in range(4):
        grow.record(waited_s=0.001, elapsed_s=0.1)   # 1% waited: enough builders
    assert pool.active == 1
    for _ in range(8):
        grow.record(waited_s=0.02, elapsed_s=0.1)    # 20% waited: one more, twice
    assert pool.active == 3 and grow.grown == 2
    for _ in range(4):
        grow.record(waited_s=0.05, elapsed_s=0.1)
    assert pool.active == 3                          # no more than the pool's count


def _failed_read(plan):
    def broken(epoch):
        raise ValueError("shard s3://bucket/part-7.parquet: column 'features' missing")
        yield

    built = Prefetcher(InOrderSampler(TASKS), PretrainBatches(plan, broken), depth=2, device=CPU,
                       builder="process")
    try:
        with pytest.raises(RuntimeError, match="prefetch process failed") as info:
            built.next(10)
    finally:
        built.close()
    return info.value


def _failed_build(plan):
    built = Prefetcher(InOrderSampler(["no-such-task"]), local_batches(plan), depth=2, device=CPU,
                       builder="process")
    try:
        with pytest.raises(RuntimeError) as info:
            built.next(10)
    finally:
        built.close()
    return info.value


def _killed(plan):
    built = Prefetcher(InOrderSampler(TASKS), local_batches(plan), depth=1, device=CPU,
                       builder="process")
    try:
        built.next(1000)
        os.kill(built._process._proc.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError) as info:
            take(built, 5)
    finally:
        built.close(timeout=5)
    return info.value


ORPHAN = """
import os, signal
import torch
from vlp.datasets.stream.data_config import DataConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches
from vlp.models import create_model
from vlp.platform.training.prefetch import Prefetcher
from vlp.testing.toy import InOrderSampler

TASKS = {tasks!r}

if __name__ == "__main__":
    _, spec, _ = create_model("uniter-tiny", TASKS, region_feat_dim=64, num_classes=17)
    cfg = DataConfig.for_model(spec, (SourceConfig("coco", {coco!r}),), batch_units=1024,
                               bucket_window=64)
    built = Prefetcher(InOrderSampler(TASKS), local_batches(plan_data(cfg, TASKS, model=spec)),
                       depth=2, device=torch.device("cpu"), builder="process")
    built.next(1000)
    print(built._process._proc.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)   # as Ray kills a failed worker: no clean-up
"""


def _orphaned(tiny_world, tmp_path):
    """A training process killed outright (as Ray kills a failed worker): its builder's
    pipes close, and it exits. The pid of a builder still alive after 60 s, else None."""
    import subprocess
    import sys
    import time

    script = tmp_path / "worker.py"
    script.write_text(ORPHAN.format(tasks=TASKS, coco=str(tiny_world / "images" / "coco")))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    child = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 60
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    return child if _alive(child) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie (exited, not yet reaped by init) counts as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_builders_failures_reach_the_loop_with_their_cause(plan, tiny_world, tmp_path):
    """A failed read of the stream (in this process), an error building a batch (in the
    builder: raised here with its traceback), a builder killed (reported, not waited for),
    and a training process killed (its builder exits too). The four run side by side: each
    builder takes seconds to start."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(case, plan) for case in (_failed_read, _failed_build, _killed)]
        orphan = pool.submit(_orphaned, tiny_world, tmp_path)
        read, build, killed = [f.result() for f in futures]
        assert orphan.result() is None, "a batch builder outlived its training process"
    assert "column 'features' missing" in str(read.__cause__)
    cause = build.__cause__
    assert "batch builder process" in str(cause) and "no-such-task" in str(cause)
    assert isinstance(cause.__cause__, (KeyError, ValueError))    # the builder's own error
    assert "exited unexpectedly" in str(killed.__cause__)
    assert str(-signal.SIGKILL) in str(killed.__cause__)


def test_a_batch_packs_into_one_buffer_and_unpacks_to_the_same_tensors():
    batch = {"ids": torch.arange(7), "feat": torch.randn(3, 5).half(),
             "mask": torch.rand(2, 3) > 0.5, "n": torch.tensor(4), "empty": torch.zeros(0, 9),
             "strided": torch.randn(4, 6).t(), "names": ["a", "b"],
             "task_batches": {"mlm": {"x": torch.randn(2, 2, dtype=torch.float64)}}}
    buffer, layout = pack(batch)
    assert buffer.is_shared() and buffer.dtype == torch.uint8
    back = unpack(buffer, layout)
    assert back["names"] == ["a", "b"]
    for k in ("ids", "feat", "mask", "n", "empty", "strided"):
        assert back[k].dtype == batch[k].dtype and torch.equal(back[k], batch[k]), k
    assert torch.equal(back["task_batches"]["mlm"]["x"], batch["task_batches"]["mlm"]["x"])
    for v in (back["ids"], back["feat"], back["strided"]):   # views of the one buffer
        assert v.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()


def test_a_builder_that_is_not_a_thread_or_a_process_is_refused():
    with pytest.raises(ValueError, match="builder 'fork'"):
        Prefetcher(InOrderSampler(TASKS), None, depth=1, device=CPU, builder="fork")


def test_a_source_that_cannot_leave_the_process_is_refused_in_one_line(plan):
    class Local:   # a class defined in a function: pickle cannot name it
        def next(self, task):
            return {}

        def state_dict(self):
            return {}

    # when the loop builds its stage (a set-up error), not at its first batch
    with pytest.raises(TypeError, match="batch source .Local. cannot be sent to another "
                                        "process .* use batch_builder: thread"):
        Prefetcher(InOrderSampler(TASKS), Local(), depth=1, device=CPU, builder="process")
