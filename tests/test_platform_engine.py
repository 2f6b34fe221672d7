"""The DeepSpeed config built from the typed config, the LR schedule, and a real engine for
each precision / ZeRO stage / accumulation combination (one process, world size 1)."""

from __future__ import annotations

import json

import pytest

from engine_subprocess import run_one_rank
from vlp.platform.training.engine import (WarmupLinearDecay, deepspeed_config,
                                         model_state_bytes, param_groups, zero_stage)
from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.pretrain.run import loop_config

BASE = {"data": {"sources": {"a": {"path": "/x"}}}, "train": {"steps": 100},
        "optimizer": {"warmup_steps": 10}}


def cfg_with(*overrides):
    return loop_config(load_experiment_config(data=BASE, overrides=overrides))


def test_cpu_config_uses_torch_fused_adamw_and_the_recipe():
    ds = deepspeed_config(cfg_with("train.grad_accum=4", "train.zero_stage=2"), world_size=2)
    assert ds["optimizer"] == {"type": "AdamW", "params": {
        "lr": 5e-5, "betas": [0.9, 0.98], "eps": 1e-6, "weight_decay": 0.01, "torch_adam": True,
        "fused": True}}
    plain = deepspeed_config(cfg_with("optimizer.impl=torch"), world_size=1)
    assert "fused" not in plain["optimizer"]["params"]
    assert ds["gradient_accumulation_steps"] == 4 and ds["train_batch_size"] == 8
    assert ds["train_micro_batch_size_per_gpu"] == 1
    assert ds["zero_optimization"] == {"stage": 2}
    assert ds["gradient_clipping"] == 5.0
    assert "bf16" not in ds and "fp16" not in ds
    assert "gradient_clipping" not in deepspeed_config(cfg_with("optimizer.grad_clip=0"), 1)


def test_zero_auto_partitions_across_workers_only():
    """One worker has nothing to partition: ZeRO would only copy gradients and weights
    (except under bf16: fp32 gradient accumulation needs ZeRO >= 1). Several: ZeRO-1 where
    model state fits in half the device (one reduction per step), else ZeRO-2."""
    auto = cfg_with("train.steps=100")
    assert auto.train.zero_stage == "auto"
    assert deepspeed_config(auto, 1)["zero_optimization"] == {"stage": 0}
    assert deepspeed_config(auto, 2)["zero_optimization"] == {"stage": 1}
    bf16 = deepspeed_config(cfg_with("train.precision=bf16"), 1)
    assert bf16["zero_optimization"] == {"stage": 1}
    assert bf16["data_types"] == {"grad_accum_dtype": "fp32"}
    assert bf16["communication_data_type"] == "fp32"
    gib = 1 << 30
    # uniter-large (341 M) on 8 A100-40GB: ~3 GiB of model state per worker: ZeRO-1
    assert zero_stage("auto", 8, precision="bf16", num_parameters=341_000_000,
                      device_memory=40 * gib) == 1
    # a 3 B-parameter model on 8 x 24 GB: ZeRO-1 would hold ~27 GiB per worker; ZeRO-2
    assert zero_stage("auto", 8, precision="bf16", num_parameters=3_000_000_000,
                      device_memory=24 * gib) == 2
    assert model_state_bytes(100, 4, 2, "bf16") < model_state_bytes(100, 4, 1, "bf16") < \
        model_state_bytes(100, 4, 0, "bf16")
    assert deepspeed_config(auto, 2, num_parameters=8 << 20)["zero_optimization"][
        "reduce_bucket_size"] == 1 << 20
    # an explicit stage is what runs, also on one worker
    assert deepspeed_config(cfg_with("train.zero_stage=1"), 1)["zero_optimization"] == {
        "stage": 1}


def test_gpu_config_uses_the_fused_optimizer_and_half_precision():
    ds = deepspeed_config(cfg_with("scaling.use_gpu=true", "train.precision=fp16"), 8)
    assert ds["optimizer"]["params"]["fused"] is True             # torch's fused AdamW
    assert ds["fp16"]["enabled"] and ds["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    ds = deepspeed_config(cfg_with("scaling.use_gpu=true", "train.precision=bf16",
                                   "optimizer.impl=torch-fused"), 8)
    assert ds["bf16"] == {"enabled": True}
    assert ds["optimizer"]["params"]["fused"] is True and ds["optimizer"]["params"]["torch_adam"]


def test_precision_auto_is_bf16_where_the_gpu_has_it_else_fp16_with_loss_scaling(monkeypatch):
    import torch

    from vlp.platform.training.engine import precision_line, resolve_precision

    auto = cfg_with("scaling.use_gpu=true")
    assert auto.train.precision == "auto"
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_precision(auto, cuda) == "fp16"
    line = precision_line(auto, "fp16", cuda)
    assert line == ("precision fp16 (auto: Tesla V100-SXM2-16GB has no bf16: fp16 with "
                    "dynamic loss scaling)")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_precision(auto, cuda) == "bf16"
    # CPU workers: fp32; a fixed precision is what runs
    assert resolve_precision(cfg_with(), torch.device("cpu")) == "fp32"
    assert precision_line(cfg_with("train.precision=bf16"), "bf16", torch.device("cpu")) == \
        "precision bf16 (train.precision)"


def test_warmup_then_linear_decay():
    f = WarmupLinearDecay(warmup_steps=4, total_steps=12)
    mult = [f(i) for i in range(12)]           # index i = optimizer step i + 1
    assert mult[:4] == [0.25, 0.5, 0.75, 1.0]
    assert mult[4] == 1.0 and mult[-1] == pytest.approx(1 / 8)
    assert all(a > b for a, b in zip(mult[4:], mult[5:]))
    assert WarmupLinearDecay(0, 10, decay=False)(5) == 1.0


def test_no_weight_decay_on_biases_and_norms():
    import torch

    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    decay, no_decay = param_groups(m, 0.01)
    assert [p.shape for p in decay["params"]] == [(4, 3)] and decay["weight_decay"] == 0.01
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0


ENGINE_BODY = """
    from vlp.platform.training.engine import build_engine
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config
    from vlp.testing.toy import ToyModel, ToyBatchSource
    from vlp.platform.training import checkpointing

    out = {}
    reduces = []
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *a, **k):   # the largest tensor all-reduced
        reduces.append(tensor.numel())
        return real_all_reduce(tensor, *a, **k)
    dist.all_reduce = counting_all_reduce

    def draws():
        import random, numpy as np
        return [random.random(), float(np.random.rand()), float(torch.rand(()))]

    def same_params(a, b):
        return all(torch.equal(x, y) for x, y in zip(a.module.state_dict().values(),
                                                     b.module.state_dict().values()))

    def one_step(engine, src, gas, dtype):
        torch.manual_seed(7)
        losses = []
        for _ in range(gas):
            b = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in
                 src.next("mlm").items()}
            loss = engine(b, task="mlm")["loss"]
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses
    for combo in json.loads(sys.argv[2]):
        cfg = loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1},
            "train": {"steps": 6, "precision": combo[0], "zero_stage": combo[1],
                      "grad_accum": combo[2]},
            "optimizer": {"warmup_steps": 2, "lr": 1e-2, "impl": combo[3]}}))
        torch.manual_seed(0)
        engine = build_engine(ToyModel(["mlm"]), cfg, stage_steps=6, world_size=1)
        src, dtype = ToyBatchSource(16, 0, 0, 0), {"fp32": torch.float32,
                                                 "bf16": torch.bfloat16}[combo[0]]
        losses, lrs = [], []
        reduces.clear()
        for step in range(6):
            lrs.append(engine.get_lr()[0])
            for _ in range(combo[2]):
                b = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in
                     src.next("mlm").items()}
                loss = engine(b, task="mlm")["loss"]
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
        optimizer_steps = engine.global_steps
        n_reduces = max(reduces, default=0)
        with tempfile.TemporaryDirectory() as d:
            st = checkpointing.TrainerState(step=6, world_size=1)
            checkpointing.seed_everything(5)         # the RNG state the checkpoint must keep
            checkpointing.save(engine, d, st, 0, src.state_dict())
            at_save = draws()
            # a fresh engine from other initial weights: everything must come from the files
            torch.manual_seed(1)
            fresh = build_engine(ToyModel(["mlm"]), cfg, stage_steps=6, world_size=1)
            differed = not same_params(engine, fresh)
            state, per_rank = checkpointing.load(fresh, d, 0, 1)
            checkpointing.set_rng_state(per_rank["rng"])
            restored = draws()
        loaded = same_params(engine, fresh)
        src2 = ToyBatchSource(16, 0, 0, 0)
        src2.load_state_dict(per_rank["batch_source"])
        # the next optimizer step on both, dropout drawn alike: the same losses and weights
        # only if Adam's moments, the step count and the schedule came back too
        nxt = [one_step(e, s, combo[2], dtype) for e, s in ((engine, src), (fresh, src2))]
        out["-".join(map(str, combo))] = {
            "losses": losses, "lrs": lrs, "step": state.step,
            "calls": per_rank["batch_source"]["calls"], "optimizer_steps": optimizer_steps,
            "differed": differed, "loaded": loaded, "rng": at_save == restored,
            "next_losses": nxt, "after_next": same_params(engine, fresh),
            "fresh_steps": fresh.global_steps, "fresh_lr": fresh.get_lr()[0],
            "largest_all_reduce": n_reduces,
            "lr": engine.get_lr()[0]}
        engine.destroy()
        fresh.destroy()

    # the loop's non-finite policy on a real engine: raise, or skip up to a limit
    from vlp.platform.training.loop import _Worker
    from vlp.platform.training.prefetch import Prefetcher
    from vlp.platform.training.protocols import WorkerInfo
    from vlp.testing.toy import ToyTaskSampler

    class AlwaysNaN(ToyBatchSource):
        def next(self, task):
            b = super().next(task)
            b["x"][0, 0] = float("nan")
            return b

    for policy, source in (("raise", ToyBatchSource(16, 0, 0, 0, nan_at_call=2)),
                           ("skip", ToyBatchSource(16, 0, 0, 0, nan_at_call=2)),
                           ("skip", AlwaysNaN(16, 0, 0, 0))):
        cfg = loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1},
            "train": {"steps": 6, "on_nonfinite": policy, "max_nonfinite_skips": 3},
            "optimizer": {"warmup_steps": 2}}))
        w = object.__new__(_Worker)
        w.cfg, w.rank, w.world, w.dtype, w.task_ids = cfg, 0, 1, torch.float32, {"mlm": 0}
        w.info = WorkerInfo(0, 1, 0, torch.device("cpu"), 0)
        w.engine = build_engine(ToyModel(["mlm"]), cfg, stage_steps=6, world_size=1)
        w.sampler, w.source = ToyTaskSampler({"mlm": 1}, 0), source
        w.prefetch = Prefetcher(w.sampler, source, depth=0, device=torch.device("cpu"))
        w.stage_ends, w.stop_at, w.shape, w.overflow_skips = [6], 6, None, 0
        state = checkpointing.TrainerState(world_size=1)
        try:
            records = [w._optimizer_step(state) for _ in range(3)]
            out[f"nonfinite-{policy}-{type(source).__name__}"] = {
                "steps": state.step, "skipped": state.skipped_batches,
                "optimizer_steps": w.engine.global_steps,
                "finite": all(r["loss"] == r["loss"] for r in records)}
        except FloatingPointError as e:
            out[f"nonfinite-{policy}-{type(source).__name__}"] = {"error": str(e)}
        w.engine.destroy()
    print("RESULT" + json.dumps(out))
"""


@pytest.mark.integration
def test_real_engines_for_precision_zero_and_accumulation(tmp_path):
    """fp32 and bf16 with ZeRO-0, bf16/ZeRO-1 with accumulation, bf16/ZeRO-2, torch-fused
    AdamW: each runs 6 optimizer steps and follows the schedule; its checkpoint, loaded into a
    fresh engine built from other initial weights, gives back the weights, the RNG state,
    the step count and schedule, and Adam's moments (the next step's loss and weights are
    the saving engine's, exactly). Without ZeRO on one worker, no gradient all-reduce
    (it would be the identity). Then the loop's
    non-finite policy: raise names the step and task; skip drops the batch (no optimizer
    step for it) and gives up after max_nonfinite_skips in a row."""
    combos = [["fp32", 0, 1, "auto"], ["bf16", 0, 1, "auto"], ["bf16", 1, 2, "auto"],
              ["bf16", 2, 1, "auto"], ["fp32", 2, 1, "torch-fused"]]
    out = run_one_rank(ENGINE_BODY, json.dumps(combos), cwd=tmp_path)
    err = out.pop("nonfinite-raise-ToyBatchSource")["error"]
    assert "non-finite loss at step 2" in err and "task 'mlm'" in err
    assert "train.on_nonfinite=skip" in err
    assert out.pop("nonfinite-skip-ToyBatchSource") == {"steps": 3, "skipped": 1,
                                                        "optimizer_steps": 3, "finite": True}
    err = out.pop("nonfinite-skip-AlwaysNaN")["error"]
    assert "4 non-finite batches dropped in this step" in err and "max_nonfinite_skips=3" in err
    for name, r in out.items():
        gas = int(name.split("-")[2])
        assert len(r["losses"]) == 6 * gas and all(l == l for l in r["losses"]), name
        assert r["lrs"][:2] == pytest.approx([5e-3, 1e-2]) and r["lrs"][-1] < 1e-2, name
        assert r["optimizer_steps"] == 6 and r["step"] == 6 and r["calls"] == 6 * gas, name
        # loaded into a fresh, differently seeded engine: weights, RNG, optimizer, schedule
        assert r["differed"] and r["loaded"] and r["rng"], name
        assert r["fresh_steps"] == 7 and r["fresh_lr"] == r["lr"], name
        assert r["next_losses"][0] == r["next_losses"][1] and r["after_next"], name
        # one worker without ZeRO: no gradient all-reduce (it would be the identity), only
        # gradient clipping's norm
        if name.split("-")[1] == "0":
            assert r["largest_all_reduce"] <= 1, name
