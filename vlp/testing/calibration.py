"""Pretraining for the calibration benchmarks (``jobs/benchmarks/finetune_calibration.py``,
``grounding_curve.py``): the platform's pretraining job (``mode="platform"``), or a plain
single-process loop over the pipeline's local iterator (``mode="local"``, which can run a probe
every few steps). Both write a checkpoint that ``vlp finetune --checkpoint`` reads: a platform
checkpoint folder, or a ``VLPModel`` state-dict file."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

SOURCES = ("coco", "vg", "cc", "sbu")


def pretrain(world: str, out_dir: str, name: str, *, family: str, tasks: dict[str, float],
             steps: int, lr: float, batch_units: int, seed: int, mode: str = "auto",
             dropout: float = 0.1, objective: str = "", mrfr_reduction: str = "",
             say=print) -> str:
    """Pretrain and return the checkpoint path (reused when it exists already).
    ``objective``: ``train.objective`` ("" = the family's paper's); ``mrfr_reduction``:
    ``model.mrfr_reduction`` ("" = the family's: the papers' sum over the feature width)."""
    if mode in ("auto", "platform"):
        try:
            from vlp.platform.pretrain.job import load_pretrain_config, pretrain as run_job
        except ImportError:
            if mode == "platform":
                raise
            mode = "local"
        else:
            cfg = load_pretrain_config(data={
                "run": {"name": name, "output_dir": out_dir, "seed": seed},
                "model": {"family": family, "dropout": dropout,
                          "mrfr_reduction": mrfr_reduction},
                "data": {"sources": {s: {"path": f"{world}/images/{s}"} for s in SOURCES},
                         "batch_input_units": batch_units},
                "tasks": tasks, "train": {"steps": steps, "log_every": max(1, steps // 10),
                                          "objective": objective},
                "optimizer": {"lr": lr, "warmup_steps": max(1, steps // 10)},
                "scaling": {"num_workers": 1}, "checkpoint": {"interval": steps},
                "mlflow": {"enabled": False}})
            return run_job(cfg, progress=False, say=say).checkpoint_path
    return local_pretrain(world, str(Path(out_dir) / f"{name}.pt"), family=family, tasks=tasks,
                          steps=steps, lr=lr, batch_units=batch_units, seed=seed,
                          dropout=dropout, objective=objective,
                          mrfr_reduction=mrfr_reduction, say=say)


def local_pretrain(world: str, out: str, *, family: str, tasks: dict[str, float], steps: int,
                   lr: float, batch_units: int, seed: int, dropout: float = 0.1,
                   objective: str = "", mrfr_reduction: str = "", say=print, every: int = 0,
                   on_every=None) -> str:
    """``on_every(step, model, spec)`` (``spec``: ``create_model``'s) runs after every
    ``every``-th step (e.g. a probe), in eval mode; training resumes in train mode after it."""
    from vlp.datasets.storage.world import load_manifest
    from vlp.datasets.stream.data_config import DataConfig, SourceConfig
    from vlp.datasets.stream.data_plan import plan_data
    from vlp.datasets.stream.local_stream import local_batches
    from vlp.datasets.batching.task_sampler import SummedTasks, TaskSampler
    from vlp.models.families import get_family
    from vlp.platform.training import objective as objectives
    from vlp.models import create_model
    from vlp.platform.training.engine import WarmupLinearDecay, param_groups

    if Path(out).is_file():
        return out
    torch.manual_seed(seed)
    sources = tuple(SourceConfig(s, f"{world}/images/{s}") for s in SOURCES)
    m = load_manifest(world, check_files=False)
    model, spec, _ = create_model(family, list(tasks), region_feat_dim=m.feature_dim,
                                  num_classes=m.num_classes or 1601,
                                  overrides={"transformer.hidden_dropout": dropout,
                                             "transformer.attention_dropout": dropout,
                                             **({"mrfr_reduction": mrfr_reduction}
                                                if mrfr_reduction else {})})
    # the model's preprocessing decides the input (ImageBERT's 5-d locations, SOHO's pixels)
    plan = plan_data(DataConfig.for_model(spec, sources, batch_units=batch_units, seed=seed),
                     tasks, model=spec)
    summed = (objective or get_family(family).objective) == "summed"
    batches = local_batches(plan)
    sampler = (SummedTasks(tasks, seed, groups=get_family(family).forward_groups) if summed
               else TaskSampler(tasks, seed))
    # the platform's recipe: AdamW (0.9, 0.98), no decay on biases/norms, warm-up + linear
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=lr, betas=(0.9, 0.98), eps=1e-6)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, WarmupLinearDecay(max(1, steps // 10), steps))
    start, seen = time.perf_counter(), {}
    try:
        for step in range(1, steps + 1):
            task = sampler.next()
            out_ = objectives.forward(model, batches.next(task), task)
            opt.zero_grad()
            out_["loss"].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            opt.step()
            sched.step()
            for k, v in out_.items():
                seen.setdefault(k, []).append(float(v.detach()))
            if step % max(1, steps // 10) == 0:
                means = " ".join(f"{k} {np.mean(v[-50:]):.3f}" for k, v in sorted(seen.items()))
                say(f"  pretrain {step}/{steps} {time.perf_counter() - start:.0f}s {means}")
            if on_every is not None and every > 0 and step % every == 0:
                model.eval()
                on_every(step, model, spec)
                model.train()
    finally:
        batches.close()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(out).with_suffix(".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(out)
    return out
