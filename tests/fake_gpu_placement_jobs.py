"""Run by tests/test_gpu_placement.py in a process of its own: a Ray with 2 fake GPUs and an
A10G accelerator_type resource on a CPU machine (the way a GPU node with a CPU-only torch looks
to Ray); a 2-worker Ray Train job (use_gpu, gloo) whose workers take their device the way
vlp's loop does, a sweep trial's kept worker group of 2, and a Ray Data actor pool of vlp's extraction actors with one GPU each. Each
process writes what it saw to a JSON file in argv[1]. No allocator variable is set here: what
the processes see comes from vlp. Then, on the same Ray, ``vlp data extract`` on the images in
argv[2] with ``--gpus 3`` (more than the cluster has) and ``--gpus 1`` (an actor given a GPU
torch cannot see); each prints ``EXIT <status>``."""

from __future__ import annotations

import json
import os
import sys
import time

import ray
import ray.data
import ray.train
import ray.train.torch

OUT = sys.argv[1]
ALLOC = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def seen_env() -> dict:
    return {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "alloc": {k: os.environ[k] for k in ALLOC if k in os.environ}}


def train_loop(config: dict) -> None:
    import torch.distributed as dist

    from vlp.platform.training.gpu_placement import deepspeed_args, ray_worker_placement
    from vlp.platform.training.worker_context import RayTrainContext

    ctx = RayTrainContext()                    # what loop._Worker builds
    device = ctx.device(use_gpu=True)          # checked placement, or one line raised
    placement = ray_worker_placement(device)
    seen = {**seen_env(), "rank": ctx.rank, "local_rank": ctx.local_rank,
            "env_local_rank": os.environ.get("LOCAL_RANK"), "device": str(device),
            "visible_entry": placement.visible_entry(),
            "deepspeed_device_rank": deepspeed_args(device).device_rank,
            "backend": dist.get_backend()}
    with open(os.path.join(OUT, f"train-{ctx.rank}.json"), "w") as f:
        json.dump(seen, f)


def extractor_class():
    from vlp.platform.extract.model_stage import RunExtractor

    class Recording(RunExtractor):
        """vlp's extraction actor; records its GPU and environment once it is built."""

        def __init__(self, *args):
            from vlp.platform.extract.model_stage import NoCudaError

            try:   # a fake GPU: vlp's actor refuses the CPU after taking its placement
                super().__init__(*args)
                refused = ""
            except NoCudaError as e:
                refused = str(e)
            with open(os.path.join(OUT, f"extract-{os.getpid()}.json"), "w") as f:
                json.dump({**seen_env(), "refused": refused}, f)

        def __call__(self, batch):
            time.sleep(0.2)        # both actors of the pool get blocks
            return {"id": batch["id"], "pid": [os.getpid()] * len(batch["id"])}

    return Recording


def main() -> None:
    from vlp.models.vision.extractors.base import ExtractSettings

    for k in ALLOC:
        os.environ.pop(k, None)
    ray.init(address="local", num_cpus=4, num_gpus=2, resources={"accelerator_type:A10G": 1},
             include_dashboard=False, log_to_driver=False)
    settings = ExtractSettings(short_side=32, long_side=48)
    rows = (ray.data.range(64, override_num_blocks=16)
            .map_batches(extractor_class(), fn_constructor_args=("pixels", None, settings, True),
                         compute=ray.data.ActorPoolStrategy(size=2), num_gpus=1, batch_size=4)
            .take_all())
    assert len(rows) == 64
    print(f"extract: {len({r['pid'] for r in rows})} actors")
    ray.train.torch.TorchTrainer(
        train_loop,
        scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=True,
                                               accelerator_type="A10G"),
        torch_config=ray.train.torch.TorchConfig(backend="gloo"),
        run_config=ray.train.RunConfig(name="placement", storage_path=os.path.join(OUT, "st")),
    ).fit()
    print("placement: ok")
    kept_group()
    refusals(sys.argv[2], os.path.join(OUT, "extract-out"))
    ray.shutdown()


def kept_group() -> None:
    """A sweep trial's kept worker group on the fake GPUs (gloo for NCCL, as above): each
    rank's placement once the group has formed."""
    from vlp.platform.training.loop_config import LoopScaling
    from vlp.platform.training.worker_group import WorkerGroup

    WorkerGroup.gpu_backend = "gloo"
    with WorkerGroup(LoopScaling(num_workers=2, use_gpu=True, accelerator_type="A10G")) as group:
        group.start()
        seen = ray.get([a.placement.remote() for a in group.actors])
    with open(os.path.join(OUT, "group.json"), "w") as f:
        json.dump(seen, f)


def refusals(images: str, out: str) -> None:
    """No silent fallback: ``--gpus 3`` refused before any actor starts, naming both numbers;
    ``--gpus 1`` gets its actor, which sees no CUDA and ends the job in one line."""
    from vlp.cli import main as vlp

    args = ["data", "extract", "--images", images, "--out", out, "--source", "x",
            "--model", "grid-tiny", "--grid", "4", "--short-side", "64", "--long-side", "96"]
    for gpus in ("3", "1"):
        print("EXIT", vlp(args + ["--gpus", gpus]), flush=True)


if __name__ == "__main__":
    main()
