"""GPU defaults that need nothing compiled, checked on CPU: precision ``auto``, torch's fused
AdamW, ZeRO buckets scaled to the model, the device peak table, and activation checkpointing
(same loss and gradients as without)."""

from __future__ import annotations

import torch

from vlp.platform.training.device_peaks import peak_flops
from vlp.platform.training.engine import deepspeed_config, resolve_precision, zero_bucket_elements
from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.pretrain.run import loop_config

BASE = {"data": {"sources": {"a": {"path": "/x"}}}, "train": {"steps": 100},
        "optimizer": {"warmup_steps": 10}}


def cfg_with(*overrides):
    return loop_config(load_experiment_config(data=BASE, overrides=overrides))


def test_precision_auto_is_fp32_on_cpu_and_bf16_for_gpu_runs():
    assert cfg_with().train.precision == "auto"
    assert resolve_precision(cfg_with(), torch.device("cpu")) == "fp32"
    assert "bf16" not in deepspeed_config(cfg_with(), 2, device=torch.device("cpu"))
    gpu = deepspeed_config(cfg_with("scaling.use_gpu=true"), 8)   # the driver, no GPU here
    assert gpu["bf16"] == {"enabled": True}
    assert resolve_precision(cfg_with("scaling.use_gpu=true", "train.precision=fp32")) == "fp32"


def test_gpu_default_optimizer_is_torch_fused_adamw_and_zero_overlaps():
    ds = deepspeed_config(cfg_with("scaling.use_gpu=true"), 8, num_parameters=110_000_000)
    assert ds["optimizer"]["params"]["torch_adam"] and ds["optimizer"]["params"]["fused"]
    zero = ds["zero_optimization"]
    assert zero["overlap_comm"] is True
    # an eighth of 110M, down to a multiple of 1024
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 13_749_248
    cpu = deepspeed_config(cfg_with(), 2, num_parameters=2_000)["zero_optimization"]
    assert "overlap_comm" not in cpu and cpu["reduce_bucket_size"] == 999_424
    assert zero_bucket_elements(10**11) == 499_999_744
    # uniter-base's count: an eighth of it is odd, which DeepSpeed's ZeRO refuses
    for n in (114_117_473, 86_000_003, 10**11, 5_000_001):
        assert zero_bucket_elements(n) % 1024 == 0 and zero_bucket_elements(n) > 0


def test_peaks_match_exact_device_names_only():
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert peak_flops("NVIDIA H100 80GB HBM3", "fp32") == 989.4e12 / 2   # TF32
    assert peak_flops("NVIDIA A10", "bf16") == 125e12
    assert peak_flops("NVIDIA A10G", "bf16") == 70e12         # its own row, not the A10's
    assert peak_flops("NVIDIA A10G ", "bf16") is None         # exact names only
    assert peak_flops(None, "fp32") is None                   # a CPU: unknown, not invented
    assert peak_flops("NVIDIA A10G", "bf16", configured_tflops=70) == 70e12


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    from vlp.models import create_model
    from vlp.testing.example_batches import example_batch

    model, spec, _ = create_model("uniter-tiny", tasks=["mlm", "itm"], region_feat_dim=32,
                                  num_classes=9)
    model.train()                 # dropout on: the recompute must replay the same masks
    batch = example_batch(spec, "mlm", batch_size=3, text_len=8, num_regions=5)

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        loss = model(batch, task="mlm")["loss"]
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}

    plain_loss, plain = loss_and_grads()
    model.set_activation_checkpointing(True)
    ckpt_loss, ckpt = loss_and_grads()
    model.set_activation_checkpointing(False)
    assert torch.equal(plain_loss, ckpt_loss) and plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)
