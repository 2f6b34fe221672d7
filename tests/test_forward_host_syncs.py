"""No device→host sync in the model's forward and loss, for every pretraining task of every
family, on batches that come the loop's way: the real batcher over the tiny world
(``local_batches``: masking, ITM negatives, collate), the loop's ``Prefetcher`` (host
integers taken out, tensors moved and cast) and ``objective.forward`` (one task, or the
summed objective's every task on one example set).

On a CPU nothing waits, so the operations that would make the host wait for a GPU are
recorded by what they are (``vlp.platform.training.host_syncs``): a value read into Python, a copy to
the host, an operation whose output shape depends on the values. The GPU check
(jobs/benchmarks/gpu_check.py) counts the same on CUDA with ``torch.cuda.set_sync_debug_mode``.
The whole step (backward, clip, optimizer, statistics too) is counted by the same recorder in
test_step_host_syncs.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vlp.datasets.batching.task_sampler import SummedTasks
from vlp.datasets.stream.data_config import DataConfig, SourceConfig
from vlp.datasets.stream.data_plan import plan_data
from vlp.datasets.stream.local_stream import local_batches
from vlp.models import create_model
from vlp.models.families import FAMILIES
from vlp.platform.training import objective
from vlp.platform.training.prefetch import Prefetcher
from vlp.testing.toy import InOrderSampler
from vlp.platform.training.host_syncs import HostSyncRecorder

torch.set_num_threads(1)
WORDS = "the quick brown fox jumps over a lazy dog near river bank under blue sky".split()
TINY = sorted(n for n in FAMILIES if n.endswith("-tiny") and not n.startswith("soho-r"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("books")
    rng = np.random.default_rng(0)
    (d / "a.txt").write_text("\n".join(" ".join(rng.choice(WORDS, int(rng.integers(3, 20))))
                                       for _ in range(60)) + "\n")
    return d


def _family_setup(name, tiny_world, corpus):
    family = FAMILIES[name]
    tasks = list(family.tasks)
    torch.manual_seed(0)
    model, spec, _ = create_model(name, tasks, region_feat_dim=64, num_classes=17)
    cfg = DataConfig.for_model(spec, (SourceConfig("coco", str(tiny_world / "images" / "coco")),),
                               batch_units=1024, bucket_window=64,
                               text_corpus=str(corpus) if "mlm-text" in tasks else None)
    plan = plan_data(cfg, tasks, model=spec)
    return family, tasks, model, plan


def _draws(family, tasks):
    """What the loop draws: each task alone (sampled), or the task set (summed) and each
    task alone as well."""
    draws = list(tasks)
    if family.objective == "summed":
        draws.insert(0, SummedTasks({t: 1.0 for t in tasks}, 0, known=tasks).next())
    return draws


def forward_syncs(name, tiny_world, corpus):
    """{draw: recorded events} for one forward + loss of each of the family's draws."""
    family, tasks, model, plan = _family_setup(name, tiny_world, corpus)
    model.train()
    source = local_batches(plan)
    draws = _draws(family, tasks)
    # SOHO's visual dictionary takes its entries from the run's first training batch and
    # reads its "initialised" flag once: a one-time read, before the recorded forwards
    warm = [draws[0]] if hasattr(model.backbone.visual, "dictionary") else []
    prefetch = Prefetcher(InOrderSampler(warm + draws), source, depth=0, device=torch.device("cpu"))
    found = {}
    try:
        for _ in warm:
            item = prefetch.next()
            objective.forward(model, item.batch, item.task)["loss"].backward()
        for draw in draws:
            item = prefetch.next()
            with HostSyncRecorder() as syncs:
                out = objective.forward(model, item.batch, item.task)
            out["loss"].backward()
            assert torch.isfinite(out["loss"]), (name, draw, out)
            found[draw if isinstance(draw, str) else "+".join(draw)] = syncs.events
    finally:
        prefetch.close()
        source.close()
    return found


@pytest.mark.parametrize("name", TINY)
def test_forward_and_loss_read_nothing_back_from_the_device(name, tiny_world, corpus):
    found = forward_syncs(name, tiny_world, corpus)
    bad = {draw: [f"{e.what} at {e.where}" for e in events]
           for draw, events in found.items() if events}
    assert not bad, f"{name}: host syncs in forward+loss:\n" + "\n".join(
        f"  {draw}: {lines}" for draw, lines in bad.items())
