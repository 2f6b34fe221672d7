"""The batch stream of pretraining, without Ray: ranks that agree on epoch ends stay in step
(the same epoch at every step), and a stream restored from ``state_dict`` continues with
exactly the batches an uninterrupted one serves — mid-epoch and epochs later."""

from __future__ import annotations

import hashlib
import threading

import pytest
import torch

from vlp.datasets.stream.data_config import DataConfig, world_sources
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_blocks
from vlp.datasets.batching.pretrain_batches import PretrainBatches
from vlp.datasets.batching.task_sampler import TaskSampler
from vlp.models import create_model

MIX = {"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1}
WORLD = 2


@pytest.fixture(scope="module")
def plan(tiny_world):
    spec = create_model("uniter-tiny", list(MIX), region_feat_dim=64, num_classes=17).preprocess
    cfg = DataConfig.for_model(spec, world_sources(str(tiny_world)), batch_units=1024,
                               read_rows=8, bucket_window=256)
    return plan_data(cfg, MIX, model=spec)


class AnyOf:
    """``epoch_sync`` across threads: the all-reduce (MAX) of a flag, by barrier."""

    def __init__(self, n: int):
        self.barrier, self.flags = threading.Barrier(n), [False] * n

    def for_rank(self, rank: int):
        def sync(exhausted: bool) -> bool:
            self.flags[rank] = exhausted
            self.barrier.wait()
            out = any(self.flags)
            self.barrier.wait()
            return out
        return sync


def batch_digest(batch: dict) -> str:
    """A hash of every tensor's key, dtype, shape and bytes: permuted examples or re-paired
    ITM negatives change it (a sum of the values would not)."""
    h = hashlib.sha1()
    for key in sorted(batch):
        v = batch[key]
        if torch.is_tensor(v):
            h.update(f"{key}:{v.dtype}:{tuple(v.shape)}".encode())
            h.update(v.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                     if v.dtype != torch.bool else v.numpy().tobytes())
    return h.hexdigest()


def serve(plan, steps: int, states=None, start: int = 0):
    """Per rank: (task, epoch, digest of the batch) per step, and the final state."""
    sync, out = AnyOf(WORLD), [None] * WORLD

    def worker(rank: int):
        batches = PretrainBatches(plan, local_blocks(plan, rank, WORLD), rank=rank,
                                  epoch_sync=sync.for_rank(rank))
        if states:
            batches.load_state_dict(states[rank])
        sampler = TaskSampler(MIX, seed=3)
        sampler.step = start
        seen = []
        for _ in range(steps):
            task = sampler.next()
            b = batches.next(task)
            seen.append((task, batches.epoch, batch_digest(b)))
        out[rank] = (seen, batches.state_dict())
        batches.close()

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(o is not None for o in out), "a rank did not finish (deadlock?)"
    return out


def test_ranks_end_epochs_together_and_restored_streams_continue_exactly(plan):
    full = serve(plan, 40)
    epochs = [[e for _, e, _ in seen] for seen, _ in full]
    assert epochs[0] == epochs[1] and epochs[0][-1] >= 3          # several epochs, in step
    assert sum(s["stats"].get("epoch_tail_dropped", 0) for _, s in full) > 0
    for cut in (5, 17):                                            # mid-epoch 0; epochs later
        head = serve(plan, cut)
        tail = serve(plan, 40 - cut, states=[s for _, s in head], start=cut)
        for rank in range(WORLD):
            assert head[rank][0] + tail[rank][0] == full[rank][0], (cut, rank)
