"""`vlp doctor`'s training step: one model of the registry, one MLM micro-batch of random
region features and text, forward + backward + AdamW on this node's device, timed after
warm-up; its model FLOPs (``vlp.models.flops``, the loop's formula) over the device's peak
(``device_peaks``) give the MFU. A CPU says its step time (no peak: MFU n/a).

It is the bare step (no DeepSpeed engine, no data pipeline): what the device and its
software give, to compare node types; the GPU check (docs/gpu-check.md) times the whole
loop.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

# (family, examples, text tokens, regions) of the step: a GPU gets uniter-base at ~8.7k
# input units (the shipped configs' micro-batches are 10,240), a CPU the tiny debug size
GPU_STEP = ("uniter-base", 128, 32, 36)
CPU_STEP = ("uniter-tiny", 8, 16, 10)
CLS, SEP, MASK, FIRST_WORD = 101, 102, 103, 1000    # BERT WordPiece ids


def mlm_batch(spec, examples: int, text: int, regions: int, seed: int = 0
              ) -> dict[str, Any]:
    """A full-length MLM micro-batch for a region-feature family (``spec``: its
    ``PreprocessSpec``), masked by the task's own policy."""
    from vlp.contract import batch_spec as bs
    from vlp.datasets.batching.task_batch import to_torch, whole_image_feature
    from vlp.tasks import MaskContext, apply_masking

    if spec.input_kind != "regions":
        raise ValueError(f"the doctor's step needs a region-feature family, {spec.family} "
                         f"reads pixels: pass --family uniter-base (or another)")
    rng = np.random.default_rng(seed)
    ids = rng.integers(FIRST_WORD, spec.vocab_size, (examples, text))
    ids[:, 0], ids[:, -1] = CLS, SEP
    x1y1 = rng.uniform(0, 0.5, (examples, regions, 2))
    x2y2 = x1y1 + rng.uniform(0.1, 0.5, (examples, regions, 2))
    wh = x2y2 - x1y1
    area = wh[..., :1] * wh[..., 1:]
    loc = {"uniter7": np.concatenate([x1y1, x2y2, wh, area], -1),
           "imagebert5": np.concatenate([x1y1, x2y2, area], -1),
           "box4": np.concatenate([x1y1, x2y2], -1)}[spec.location_kind]
    batch = {bs.INPUT_IDS: ids.astype(np.int64),
             bs.TEXT_MASK: np.ones((examples, text), np.int64),
             bs.REGION_FEATS: np.abs(rng.standard_normal(
                 (examples, regions, spec.region_feat_dim))).astype(np.float32),
             bs.REGION_LOC: loc.astype(np.float32),
             bs.REGION_MASK: np.ones((examples, regions), np.int64),
             bs.POSITIVE: np.ones(examples, bool)}
    if spec.needs_image_feat:
        batch[bs.IMAGE_FEAT] = whole_image_feature(batch)
    ctx = MaskContext(0.15, MASK, CLS, SEP, np.arange(FIRST_WORD, spec.vocab_size))
    apply_masking("mlm", batch, rng, ctx, "conditional", "regions")
    batch[bs.NUM_EXAMPLES] = np.array(examples, np.int64)
    batch[bs.INPUT_UNITS] = np.array(examples * (text + regions), np.int64)
    return to_torch(batch)


def training_step(family: str = "", *, device: Any = None, warm: int = 2, timed: int = 3
                  ) -> dict[str, Any]:
    """The step on ``device`` (default: CUDA device 0 when there is one, else the CPU): its
    seconds (median of ``timed``), model TFLOP/s and MFU (None on a CPU or an unknown
    GPU)."""
    import torch

    from vlp.models.factory import create_model
    from vlp.models.flops import encoder_shape
    from vlp.platform.training.device_peaks import device_name, peak_flops

    if device is None:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    gpu = device.type == "cuda"
    default, examples, text, regions = GPU_STEP if gpu else CPU_STEP
    family = family or default
    bundle = create_model(family, tasks=["mlm"], init="random")
    model = bundle.model.to(device).train()
    batch = {k: v.to(device) for k, v in mlm_batch(bundle.preprocess, examples, text,
                                                    regions).items()}
    precision = "bf16" if gpu and torch.cuda.get_device_capability(device)[0] >= 8 else "fp32"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **({"fused": True} if gpu else {}))

    def step() -> float:
        t0 = time.perf_counter()
        with torch.autocast(device.type, torch.bfloat16, enabled=precision == "bf16"):
            loss = model(batch, task="mlm")["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if gpu:
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    for _ in range(warm):
        step()
    seconds = statistics.median(step() for _ in range(timed))
    shape = encoder_shape(model)
    flops = shape.train_flops(examples, examples * (text + regions)) if shape else 0.0
    name = device_name(device)
    peak = peak_flops(name, precision)
    return {"family": family, "device": name or "cpu", "precision": precision,
            "examples": examples, "input_units": examples * (text + regions),
            "step_s": seconds, "tflops": flops / seconds / 1e12,
            "mfu": flops / seconds / peak if peak else None,
            "mfu_why": "" if peak else ("CPU: no peak" if not gpu
                                        else f"no peak known for {name}")}


__all__ = ["CPU_STEP", "GPU_STEP", "mlm_batch", "training_step"]
