"""Run by tests/test_trimmed_ray.py with only the trimmed Ray first on PYTHONPATH: a Ray Data
actor-pool job and a 2-worker Ray Train job (gloo all-reduce), each worker checking that it
imported the trimmed copy. argv: the trimmed folder, a storage folder."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import ray
import ray.data
import ray.train.torch
import ray.tune  # noqa: F401  (Tune stays whole)

TRIMMED, STORAGE = sys.argv[1], sys.argv[2]


def trimmed(module) -> bool:
    return os.path.realpath(module.__file__).startswith(os.path.realpath(TRIMMED))


class Double:
    """A callable class: Ray Data runs it as an actor pool."""

    def __init__(self) -> None:
        assert trimmed(ray), ray.__file__
        self.pid = os.getpid()

    def __call__(self, batch: dict) -> dict:
        return {"y": batch["id"] * 2, "pid": np.full(len(batch["id"]), self.pid)}


def train_loop(config: dict) -> None:
    import torch
    import torch.distributed as dist
    import ray.train

    ctx = ray.train.get_context()
    total = torch.tensor([float(ctx.get_world_rank() + 1)])
    dist.all_reduce(total)
    seen = {"sum": total.item(), "trimmed": trimmed(ray), "backend": dist.get_backend()}
    with open(os.path.join(STORAGE, f"rank{ctx.get_world_rank()}.json"), "w") as f:
        json.dump(seen, f)


def main() -> None:
    assert trimmed(ray), f"ray imported from {ray.__file__}, not {TRIMMED}"
    for gone in ("ray.rllib", "ray.serve", "ray.llm"):
        assert importlib.util.find_spec(gone) is None, f"{gone} is still in the trimmed Ray"
    os.makedirs(STORAGE, exist_ok=True)
    # 4 logical CPUs: the read task beside the two actors, then the Train workers and controller
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    rows = (ray.data.range(64, override_num_blocks=4)
            .map_batches(Double, compute=ray.data.ActorPoolStrategy(size=2), batch_size=8).take_all())
    assert sorted(int(r["y"]) for r in rows) == [2 * i for i in range(64)]
    print(f"data: {len(rows)} rows through {len({int(r['pid']) for r in rows})} actor(s)")

    ray.train.torch.TorchTrainer(
        train_loop, scaling_config=ray.train.ScalingConfig(num_workers=2),
        run_config=ray.train.RunConfig(name="trimmed", storage_path=STORAGE)).fit()
    for rank in (0, 1):
        with open(os.path.join(STORAGE, f"rank{rank}.json")) as f:
            seen = json.load(f)
        print(f"train rank {rank}: {seen}")
        assert seen == {"sum": 3.0, "trimmed": True, "backend": "gloo"}, seen
    ray.shutdown()
    print("trimmed ray: ok")


if __name__ == "__main__":
    main()
