"""The DeepSpeed engine, configured from the loop's ``LoopConfig``.

One engine per pretraining stage: a stage starts from the previous stage's weights with a
fresh optimizer and its own warm-up + linear-decay schedule (ImageBERT's multi-stage recipe).
``deepspeed.initialize`` reuses the process group that Ray Train has already set up.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from vlp.platform.training.bf16_bookkeeping import use_flat_bookkeeping
from vlp.platform.training.cpu_precision import check_cpu_precision
from vlp.platform.training.deepspeed_import import (bf16_optimizer_unforced_memory_reports,
                                                    load_deepspeed)
from vlp.platform.training.device_step import attach_schedule, use_device_step
from vlp.platform.training.gpu_placement import deepspeed_args
from vlp.platform.training.grad_exchange import use_overlapped_exchange
from vlp.platform.training.jit_ops_dir import use_extensions_dir
from vlp.platform.training.loop_config import LoopConfig
# callers import WarmupLinearDecay from here
from vlp.platform.training.lr_schedule import WarmupLinearDecay, schedule_for  # noqa: F401

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
    """``train.precision`` with ``auto`` resolved: on a CUDA device bf16 where it supports it
    (Ampere and later: no loss scaling), else fp16 with dynamic loss scaling (V100, T4); fp32
    on CPU (bf16 runs there, but without AVX-512 BF16 it is slower than fp32). Without a
    device (the driver), ``scaling.use_gpu`` stands for one."""
    precision = cfg.train.precision
    if precision != "auto":
        return precision
    cuda = device.type == "cuda" if device is not None else cfg.scaling.use_gpu
    if not cuda:
        return "fp32"
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16"   # the driver without a GPU: the GPU types cluster.yaml offers have bf16


def precision_line(cfg: LoopConfig, precision: str, device: torch.device | None) -> str:
    """One line saying which precision runs and why (rank 0 prints it at start)."""
    if cfg.train.precision != "auto":
        return f"precision {precision} (train.precision)"
    if device is None or device.type != "cuda":
        return f"precision {precision} (auto: {'no GPU' if device is None else device.type})"
    name = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "GPU"
    why = ("supports bf16" if precision == "bf16"
           else "has no bf16: fp16 with dynamic loss scaling")
    return f"precision {precision} (auto: {name} {why})"


def zero_bucket_elements(num_parameters: int) -> int:
    """ZeRO reduce / all-gather bucket size: an eighth of the model, so that gradient
    reduction overlaps the backward in several pieces (DeepSpeed's 5e8 default exceeds
    every model here: one reduction after the whole backward), within [1e6, 5e8], and a
    multiple of 1024: DeepSpeed asserts that the all-gather bucket is a multiple of its NCCL
    start alignment (2 or 4 elements), which an eighth of an odd count is not."""
    elements = int(min(5e8, max(1e6, num_parameters // 8)))
    return elements - elements % 1024


# share of a device's memory that model state may take for ZeRO-1 to be chosen; the rest is
# for activations, the allocator's slack, NCCL and the CUDA context
MODEL_STATE_SHARE = 0.5


def model_state_bytes(num_parameters: int, world_size: int, stage: int, precision: str) -> int:
    """Bytes of model state per worker under ZeRO ``stage``: weights and their gradients in
    the compute dtype, an fp32 gradient buffer under bf16, fp32 master weights and Adam's two
    moments (12 bytes, partitioned from ZeRO-1 on); ZeRO-2 partitions the gradients too."""
    half = precision in ("bf16", "fp16")
    weights = 2 if half else 4
    grads = (2 + 4) if precision == "bf16" else weights
    optimizer = 12 if half else 8          # fp32 weights are the master copy already
    if stage >= 1:
        optimizer = optimizer / world_size
    if stage >= 2:
        grads = grads / world_size
    return int(num_parameters * (weights + grads + optimizer))


def zero_stage(stage: str | int, world_size: int, *, precision: str = "fp32",
               num_parameters: int | None = None, device_memory: int | None = None) -> int:
    """``train.zero_stage`` (``stage``) with ``auto`` resolved.

    Several workers: ZeRO-1 where a worker's model state fits in ``MODEL_STATE_SHARE`` of
    its device's memory (unknown memory: assumed to fit; every model here does), else
    ZeRO-2. ZeRO-1 reduces gradients once per optimizer step, at the last micro-batch;
    ZeRO-2 reduce-scatters at every micro-batch, so its traffic grows with accumulation.
    One worker: nothing to partition, so no ZeRO (it would only copy every gradient into
    buckets and every weight back) — except under bf16, where DeepSpeed accumulates
    gradients in fp32 only with ZeRO >= 1. A resumed run has taken its checkpoint's stage
    instead of ``auto`` before (``checkpointing.follow_checkpoint``)."""
    if stage != "auto":
        return stage
    if world_size == 1:
        return 1 if precision == "bf16" else 0
    if num_parameters and device_memory:
        fits = model_state_bytes(num_parameters, world_size, 1, precision) <= \
            MODEL_STATE_SHARE * device_memory
        return 1 if fits else 2
    return 1


def device_memory_bytes(device: torch.device | None) -> int | None:
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(device).total_memory


def overlaps_exchange(ds: dict[str, Any], cfg: LoopConfig, world_size: int) -> bool:
    """Whether ``train.grad_overlap`` applies: bf16 under ZeRO-1 on several ranks (DeepSpeed's
    BF16 optimizer, given the flat bookkeeping: grad_exchange.py)."""
    return (cfg.train.grad_overlap and world_size > 1 and bool(ds.get("bf16", {}).get("enabled"))
            and ds["zero_optimization"]["stage"] == 1)


def gradient_line(ds: dict[str, Any], *, overlap: bool = False, wire: str = "fp32") -> str:
    """One line: the ZeRO stage, the dtypes gradients accumulate and reduce in, and when the
    reduction happens (rank 0 prints it at start)."""
    stage = ds["zero_optimization"]["stage"]
    half = "bf16" if ds.get("bf16", {}).get("enabled") else (
        "fp16" if ds.get("fp16", {}).get("enabled") else "fp32")
    accum = ds.get("data_types", {}).get("grad_accum_dtype", half)
    comm = wire if overlap else ds.get("communication_data_type", half)
    when = ("at every micro-batch (reduce-scatter)" if stage >= 2
            else "once per optimizer step, in buckets during the last backward"
            " (train.grad_overlap)" if overlap else "once per optimizer step")
    line = (f"ZeRO-{stage}; gradients accumulate in {accum}, reduce in {comm} {when}"
            f" over {ds['gradient_accumulation_steps']} micro-batch(es)")
    if half == "bf16" and accum != "fp32":
        line += " (DeepSpeed accumulates bf16 gradients in fp32 only with ZeRO >= 1)"
    if half == "bf16" and stage == 0:
        # DeepSpeed's ZeRO-0 bf16 path (FP16_Optimizer) runs CheckOverflow.has_overflow_serial
        line += ("; its bf16 wrapper without ZeRO checks each gradient tensor for overflow"
                 " with a host sync (zero_stage: auto takes ZeRO-1)")
    return line


def deepspeed_config(cfg: LoopConfig, world_size: int, *,
                     device: torch.device | None = None,
                     num_parameters: int | None = None) -> dict[str, Any]:
    """The DeepSpeed JSON config. Batches are variable-sized (filled to an input-unit
    budget), so DeepSpeed's batch fields count micro-batches: 1 per worker per micro-step."""
    gas = cfg.train.grad_accum
    precision = resolve_precision(cfg, device)
    stage = zero_stage(cfg.train.zero_stage, world_size, precision=precision,
                       num_parameters=num_parameters,
                       device_memory=device_memory_bytes(device))
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
        # DeepSpeed's throughput timer is on by default and synchronizes the device at the
        # forward and at the step: two host waits a step, and a CUDA graph's capture fails
        "timers": {"throughput": {"enabled": False, "synchronized": False}},
    }
    if cfg.optimizer.grad_clip > 0:
        ds["gradient_clipping"] = cfg.optimizer.grad_clip
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
        if stage >= 1:
            # bf16 keeps 8 mantissa bits: summed over micro-batches and workers in bf16, small
            # gradient contributions round away. DeepSpeed's default for both is the model's
            # dtype; with ZeRO >= 1 it accumulates into an fp32 buffer and reduces that.
            ds["data_types"] = {"grad_accum_dtype": "fp32"}
            ds["communication_data_type"] = "fp32"
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
    Ampere+ GPUs means in practice). SDPA keeps torch's own choice of kernel (cuDNN's, for
    the encoder's padding mask on Hopper): the GPU check's whole-step comparisons with the
    memory-efficient kernel have not yet separated the kernel from the order the two were
    timed in (docs/gpu-check.md)."""
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
    deepspeed = load_deepspeed()   # before any other deepspeed import: deepspeed_import.py
    from deepspeed.utils import logger as ds_logger

    ds_logger.setLevel(logging.WARNING)
    configure_device(cfg, device)
    on_cpu = device.type == "cpu" if device is not None else not torch.cuda.is_available()
    if on_cpu:
        check_cpu_precision(resolve_precision(cfg, device))
    schedule = schedule_for(cfg.optimizer, stage_steps)   # both optimizers' (SOHO's too)
    n_params = sum(p.numel() for p in model.parameters())
    ds_config = deepspeed_config(cfg, world_size, device=device, num_parameters=n_params)
    # SOHO: SGD for the CNN beside AdamW, CNN frozen at first (None for the other families)
    recipe = cnn_recipe_for(model, cfg, schedule, stage_index)
    if recipe is not None:
        del ds_config["optimizer"]
    # DeepSpeed's bf16 optimizer reports memory only where its own setting asks (deepspeed_import)
    with bf16_optimizer_unforced_memory_reports(bool(ds_config.get("memory_breakdown"))):
        engine, _, _, _ = deepspeed.initialize(
            args=deepspeed_args(device),     # vlp's device, not LOCAL_RANK's (gpu_placement)
            model=model,
            model_parameters=None if recipe else param_groups(model, cfg.optimizer.weight_decay),
            optimizer=recipe.optimizer if recipe else None,
            lr_scheduler=recipe.scheduler if recipe else (
                lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule)),
            config=ds_config,
        )
    # bf16 under ZeRO-1: the fp32 gradient accumulation, norm and clip on whole lists, and
    # the step (norm, clip, non-finite skip, fused AdamW) without a host sync
    if use_flat_bookkeeping(engine.optimizer):
        if use_device_step(engine.optimizer):
            attach_schedule(engine.optimizer, engine.lr_scheduler)
        if cfg.train.grad_overlap:      # the all-reduce in buckets during the backward
            use_overlapped_exchange(
                engine, cfg.train.grad_bucket_elements or zero_bucket_elements(n_params),
                cfg.train.grad_wire_dtype, model)
    if world_size == 1 and ds_config["zero_optimization"]["stage"] == 0:
        # one rank: the gradient all-reduce is the identity, but DeepSpeed would still flatten
        # every gradient into buckets, reduce and copy them back after each backward (the
        # switch DeepSpeed itself turns off when it has no process group)
        engine.enable_backward_allreduce = False
        if isinstance(engine.optimizer, torch.optim.Optimizer):
            engine.optimizer.register_step_pre_hook(zero_fill_missing_grads)
    return engine


def zero_fill_missing_grads(optimizer: torch.optim.Optimizer, *_: Any) -> None:
    """Give every trainable parameter that no loss reached this step a zero gradient, so that
    it takes the optimizer step (AdamW's momentum and weight decay) as it does everywhere
    else: DeepSpeed's all-reduce fills such gradients with zeros on several ranks, and its
    flat optimizers (ZeRO, bf16, fp16) step every parameter. Without it, a one-rank ZeRO-0
    run would skip them (torch skips ``grad is None``): with one task per step, each head
    would stand still on the other tasks' steps, and the same config would train differently
    on one worker than on eight, or in fp32 than in bf16."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


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
