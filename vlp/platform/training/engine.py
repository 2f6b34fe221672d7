"""The DeepSpeed engine, configured from the loop's ``LoopConfig``.

One engine per pretraining stage: a stage starts from the previous stage's weights with a
fresh optimizer and its own warm-up + linear-decay schedule (ImageBERT's multi-stage recipe).
``deepspeed.initialize`` reuses the process group that Ray Train has already set up.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch

from vlp.platform.training.cpu_precision import check_cpu_precision
from vlp.platform.training.loop_config import LoopConfig
# callers import WarmupLinearDecay from here
from vlp.platform.training.lr_schedule import WarmupLinearDecay  # noqa: F401

DEFAULT_EXTENSIONS_DIR = "~/.cache/torch_extensions/vlp"


def extensions_dir(configured: str = "") -> str:
    """Where DeepSpeed's JIT ops are built and cached (the shared-memory comm op takes ~28 s
    to build cold on a 2-core CPU, ~0.2 s cached)."""
    path = configured or os.environ.get("TORCH_EXTENSIONS_DIR") or DEFAULT_EXTENSIONS_DIR
    return str(Path(path).expanduser().resolve())


def ninja_tag() -> str:
    """``ninja-<version>`` of the ``ninja`` on this process's PATH, the one torch builds with.
    Two ninja versions read each other's build log as changed and rebuild everything, so a
    driver and workers with different PATHs (a venv's ninja against the system's) would
    rebuild DeepSpeed's ops from scratch at every switch: each version gets its own folder."""
    exe = shutil.which("ninja")
    if exe is None:
        return "ninja-none"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "ninja-unknown"
    version = out.stdout.strip().split("\n")[0] if out.returncode == 0 else ""
    return "ninja-" + ("".join(c for c in version if c.isalnum() or c in ".-_") or "unknown")


def use_extensions_dir(configured: str = "") -> str:
    """Sets ``TORCH_EXTENSIONS_DIR`` to the configured folder's subfolder for this process's
    ninja (kept when it is set already)."""
    path, tag = Path(extensions_dir(configured)), ninja_tag()
    if path.name != tag:
        path = path / tag
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCH_EXTENSIONS_DIR"] = str(path)
    return str(path)


def prebuild_comm_op(configured: str = "") -> None:
    """Build (or load from cache) DeepSpeed's CPU shared-memory comm op once, in this
    process, so that workers starting together find it cached."""
    use_extensions_dir(configured)
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is not None:
        builder.load(verbose=False)


def optimizer_params(cfg: LoopConfig) -> dict[str, Any]:
    """The ``optimizer.params`` of the DeepSpeed config: the one place that chooses the
    optimizer implementation (parameter groups come from ``param_groups``)."""
    o = cfg.optimizer
    params: dict[str, Any] = {"lr": o.lr, "betas": list(o.betas), "eps": o.eps,
                              "weight_decay": o.weight_decay}
    impl = o.impl
    if impl == "auto":
        # torch's fused AdamW: kernels for CUDA and CPU ship in the wheel (DeepSpeed's
        # FusedAdam JIT-compiles on every new node and needs a matching nvcc); on CPU it is
        # also several times faster than the per-parameter loop of plain AdamW
        impl = "torch-fused"
    if impl == "torch":
        params["torch_adam"] = True
    elif impl == "torch-fused":
        params.update(torch_adam=True, fused=True)
    return params


def resolve_precision(cfg: LoopConfig, device: torch.device | None = None) -> str:
    """``train.precision`` with ``auto`` resolved: bf16 on a CUDA device that supports it,
    else fp32. Without a device (the driver), ``scaling.use_gpu`` stands for one."""
    precision = cfg.train.precision
    if precision != "auto":
        return precision
    cuda = device.type == "cuda" if device is not None else cfg.scaling.use_gpu
    if not cuda:
        return "fp32"
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16"   # the driver without a GPU: every GPU the platform targets has bf16


def zero_bucket_elements(num_parameters: int) -> int:
    """ZeRO reduce / all-gather bucket size: an eighth of the model, so that gradient
    reduction overlaps the backward in several pieces (DeepSpeed's 5e8 default exceeds
    every model here: one reduction after the whole backward), within [1e6, 5e8], and a
    multiple of 1024: DeepSpeed asserts that the all-gather bucket is a multiple of its NCCL
    start alignment (2 or 4 elements), which an eighth of an odd count is not."""
    elements = int(min(5e8, max(1e6, num_parameters // 8)))
    return elements - elements % 1024


def zero_stage(stage: str | int, world_size: int) -> int:
    """``train.zero_stage`` (``stage``) with ``auto`` resolved: ZeRO-2 across several
    workers; with one there is nothing to partition, and ZeRO would only copy every gradient
    into its buckets and partition and every updated weight back (a large share of a CPU
    step). A resumed run has taken its checkpoint's stage instead of ``auto`` before
    (``checkpointing.follow_checkpoint``)."""
    if stage == "auto":
        return 2 if world_size > 1 else 0
    return stage


def deepspeed_config(cfg: LoopConfig, world_size: int, *,
                     device: torch.device | None = None,
                     num_parameters: int | None = None) -> dict[str, Any]:
    """The DeepSpeed JSON config. Batches are variable-sized (filled to an input-unit
    budget), so DeepSpeed's batch fields count micro-batches: 1 per worker per micro-step."""
    gas = cfg.train.grad_accum
    stage = zero_stage(cfg.train.zero_stage, world_size)
    zero: dict[str, Any] = {"stage": stage}
    if num_parameters and stage > 0:
        bucket = zero_bucket_elements(num_parameters)
        zero.update(reduce_bucket_size=bucket, allgather_bucket_size=bucket)
    if cfg.scaling.use_gpu and stage > 0:
        zero["overlap_comm"] = True     # reduce on a side stream during the backward
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": gas,
        "train_batch_size": gas * world_size,
        "optimizer": {"type": "AdamW", "params": optimizer_params(cfg)},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,            # the loop reports; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
    }
    if cfg.optimizer.grad_clip > 0:
        ds["gradient_clipping"] = cfg.optimizer.grad_clip
    precision = resolve_precision(cfg, device)
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif precision == "fp16":
        # dynamic loss scaling: DeepSpeed skips overflowing steps itself (and their
        # scheduler step); the loop does not count them as steps
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                      "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    return ds


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """BERT/UNITER convention: no weight decay on biases and LayerNorm weights (1-D)."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def compute_dtype(cfg: LoopConfig, device: torch.device | None = None) -> torch.dtype:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        resolve_precision(cfg, device)]


def configure_device(cfg: LoopConfig, device: torch.device | None) -> None:
    """Per-process device settings: TF32 tensor cores for fp32 matmuls and convolutions on
    CUDA (a 10-bit mantissa in the products, fp32 accumulation; what fp32 training on
    Ampere+ GPUs means in practice)."""
    if device is None or device.type != "cuda":
        return
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def build_engine(model: torch.nn.Module, cfg: LoopConfig, stage_steps: int,
                 world_size: int, device: torch.device | None = None,
                 stage_index: int = 0) -> Any:
    """``deepspeed.initialize`` for one stage of ``stage_steps`` optimizer steps."""
    use_extensions_dir(cfg.train.extensions_dir)
    import deepspeed
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    configure_device(cfg, device)
    on_cpu = device.type == "cpu" if device is not None else not torch.cuda.is_available()
    if on_cpu:
        check_cpu_precision(resolve_precision(cfg, device))
    schedule = WarmupLinearDecay(cfg.optimizer.warmup_steps, stage_steps,
                                 decay=cfg.optimizer.schedule == "linear")
    n_params = sum(p.numel() for p in model.parameters())
    ds_config = deepspeed_config(cfg, world_size, device=device, num_parameters=n_params)
    # SOHO: SGD for the CNN beside AdamW, CNN frozen at first (None for the other families)
    recipe = cnn_recipe_for(model, cfg, schedule, stage_index)
    if recipe is not None:
        del ds_config["optimizer"]
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=None if recipe else param_groups(model, cfg.optimizer.weight_decay),
        optimizer=recipe.optimizer if recipe else None,
        lr_scheduler=recipe.scheduler if recipe else (
            lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule)),
        config=ds_config,
    )
    if world_size == 1 and ds_config["zero_optimization"]["stage"] == 0:
        # one rank: the gradient all-reduce is the identity, but DeepSpeed would still flatten
        # every gradient into buckets, reduce and copy them back after each backward (the
        # switch DeepSpeed itself turns off when it has no process group)
        engine.enable_backward_allreduce = False
    return engine


def cnn_recipe_for(model: torch.nn.Module, cfg: LoopConfig, schedule: WarmupLinearDecay,
                   stage_index: int = 0) -> Any:
    """``cnn_recipe.build_cnn_recipe`` from the config; the cold start in stage 0 only."""
    from vlp.platform.training.cnn_recipe import build_cnn_recipe

    o = cfg.optimizer
    return build_cnn_recipe(
        model, lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay,
        cnn_optimizer=o.cnn, cnn_lr=o.cnn_lr, cnn_weight_decay=o.cnn_weight_decay,
        cnn_momentum=o.cnn_momentum,
        cold_start_steps=o.cold_start_steps if stage_index == 0 else 0,
        schedule=schedule)
