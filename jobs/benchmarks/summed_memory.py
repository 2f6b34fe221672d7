"""Activation memory of a micro-batch, sampled vs summed objective (issue 18, item 3).

    python jobs/benchmarks/summed_memory.py --world runs/demo/world
    python jobs/benchmarks/summed_memory.py --world W --families imagebert-base --batch-units 8192

Under ``summed`` every task's forward keeps its graph until the one backward, so a micro-batch
holds the activations of all its tasks at once; under ``sampled`` it holds one task's. This
counts the bytes autograd saves for the backward (``saved_tensors_hooks``; each storage once,
parameters left out) on the same example budget, in train mode, for each task alone and for
the summed task set, and prints one figure per line plus the ratio summed / the largest task.
The count is exact and the same on any machine (it is what the device must hold beyond the
weights, gradients and optimizer state); divide ``batch_input_units`` by the ratio to keep a
sampled run's activation memory under summed.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager

import torch

MIXES = {"imagebert": {"mlm": 1.0, "moc": 1.0, "mrfr": 1.0, "itm": 1.0},
         "soho": {"mlm": 1.0, "mvm": 1.0, "itm": 1.0}}
SOURCES = ("coco", "vg")


@contextmanager
def saved_bytes(model: torch.nn.Module, out: list[int]):
    """Adds to ``out[0]`` the bytes of every storage autograd saves (each once; no weights)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: set[int] = set()

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            out[0] += s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def measure(family: str, world: str, batch_units: int, seed: int) -> None:
    from vlp.contract.batch_spec import NUM_EXAMPLES, TASK_BATCHES
    from vlp.datasets.batching.task_sampler import SummedTasks
    from vlp.datasets.storage.world import load_manifest
    from vlp.datasets.stream.data_config import DataConfig, SourceConfig
    from vlp.datasets.stream.data_plan import plan_data
    from vlp.datasets.stream.local_stream import local_batches
    from vlp.models import create_model
    from vlp.platform.training import objective as objectives

    mix = MIXES[family.split("-")[0]]
    torch.manual_seed(seed)
    m = load_manifest(world, check_files=False)
    model, spec, _ = create_model(family, list(mix), region_feat_dim=m.feature_dim,
                                  num_classes=m.num_classes or 1601)
    model.train()
    sources = tuple(SourceConfig(s, f"{world}/images/{s}") for s in SOURCES)
    plan = plan_data(DataConfig.for_model(spec, sources, batch_units=batch_units, seed=seed),
                     mix, model=spec)
    batches = local_batches(plan)
    try:
        task_set = SummedTasks(mix, seed, known=list(mix)).next()
        batch = batches.next(task_set)
        per_task = {}
        for t in task_set:   # each task alone on the set's own batch for that task
            got = [0]
            with saved_bytes(model, got):
                loss = model(batch[TASK_BATCHES][t], task=t)["loss"]
            loss.backward()
            model.zero_grad(set_to_none=True)
            per_task[t] = got[0]
            examples = int(batch[TASK_BATCHES][t][NUM_EXAMPLES])
            print(f"{family}.sampled.{t}_mib {got[0] / 2**20:.1f} ({examples} examples)",
                  flush=True)
        got = [0]
        with saved_bytes(model, got):
            loss = objectives.forward(model, batch, task_set)["loss"]
        loss.backward()
        print(f"{family}.summed_mib {got[0] / 2**20:.1f}", flush=True)
        print(f"{family}.summed_over_largest_task {got[0] / max(per_task.values()):.2f}",
              flush=True)
    finally:
        batches.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", required=True, help="a world folder (vlp demo --no-sweep)")
    ap.add_argument("--families", nargs="+", default=["imagebert-tiny", "soho-tiny"],
                    help="families whose paper sums the losses (imagebert-*, soho-*)")
    ap.add_argument("--batch-units", type=int, default=2048, help="input units per batch")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    bad = [f for f in args.families if f.split("-")[0] not in MIXES]
    if bad:
        print(f"--families {' '.join(bad)}: expected imagebert-* or soho-* families")
        return 2
    print(f"# activation bytes saved for the backward, {args.batch_units} input units per "
          f"batch, world {args.world}", flush=True)
    for family in args.families:
        measure(family, args.world, args.batch_units, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
