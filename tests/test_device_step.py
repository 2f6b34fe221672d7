"""The device step (``device_step.py``: norm, clip coefficient, non-finite skip and torch's
fused AdamW on the device, switched on by ``build_engine`` for bf16 under ZeRO-1) trains as
DeepSpeed's own ``BF16_Optimizer`` does: 20 steps on DeepSpeed's real engine, alternating
tasks (some parameters without a gradient in a step), a clip small enough to act on every
step, with and without accumulation, and a step whose loss is NaN, which both skip (the
weights, Adam's moments and its step count stay as they were, and the linear schedule does
not advance: the device's lr holds at once, the host's scheduler once the loop reads the
skip, two steps late)."""

from __future__ import annotations

import pytest

from engine_subprocess import run_one_rank

# Budget: 109 s measured on the 2-core machine at a load of ~25 (four engines, 20 steps each);
# it ran past 300 s at a load of ~50
pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

BODY = """
    import json
    import torch
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training.engine import build_engine
    from vlp.testing.toy import ToyBatchSource, ToyModel

    STEPS = 20
    out = {}
    for schedule, gas, nan_at in (("linear", 1, None), ("linear", 2, 9)):
        for mine in (True, False):
            cfg = loop_config(load_experiment_config(data={
                "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"itm": 1, "mrfr": 1},
                "train": {"steps": STEPS, "zero_stage": 1, "precision": "bf16",
                          "grad_accum": gas},
                "optimizer": {"warmup_steps": 3, "lr": 1e-2, "grad_clip": 2e-3,
                              "schedule": schedule}}))
            torch.manual_seed(0)
            engine = build_engine(ToyModel(["itm", "mrfr"]), cfg, stage_steps=STEPS,
                                  world_size=1)
            name = type(engine.optimizer).__name__
            if not mine:   # DeepSpeed's own bookkeeping and step
                engine.optimizer.__class__ = BF16_Optimizer
            src = ToyBatchSource(16, 0, 0, 0)
            losses, norms, applied = [], [], []
            for step in range(STEPS):
                for m in range(gas):
                    task = ("itm", "mrfr")[(step + m) % 2]
                    batch = {k: v.bfloat16() if torch.is_tensor(v) and v.is_floating_point()
                             else v for k, v in src.next(task).items()}
                    loss = engine(batch, task=task)["loss"]
                    if step == nan_at and m == gas - 1:
                        loss = loss * float("nan")
                    engine.backward(loss)
                    engine.step()
                if mine and nan_at is not None and step == nan_at + 2:   # the late read
                    engine.optimizer.read_skip(engine.lr_scheduler)
                losses.append(float(loss))
                norms.append(float(engine.get_global_grad_norm()))
                applied.append(engine.was_step_applied())
            opt = engine.optimizer
            state = [opt.optimizer.state[p] for p in opt.fp32_groups_flat_partition]
            out[f"{schedule} {gas} {mine}"] = {
                "optimizer": name, "losses": losses, "norms": norms, "applied": applied,
                "master": [p.detach().tolist() for p in opt.fp32_groups_flat_partition],
                "exp_avg": [s["exp_avg"].tolist() for s in state],
                "exp_avg_sq": [s["exp_avg_sq"].tolist() for s in state],
                "adam_steps": [float(s["step"]) for s in state],
                "schedule_index": engine.lr_scheduler.last_epoch,
                "lr": engine.lr_scheduler.get_last_lr(),
                "bf16": {k: v.float().flatten().tolist()
                         for k, v in engine.module.state_dict().items()}}
            engine.destroy()
    print("RESULT" + json.dumps(out))
"""


def test_the_device_step_trains_as_deepspeeds_bf16_optimizer(tmp_path):
    out = run_one_rank(BODY, cwd=tmp_path, timeout=450)
    for schedule, gas, nan_at in (("linear", 1, None), ("linear", 2, 9)):
        mine, ref = out[f"{schedule} {gas} True"], out[f"{schedule} {gas} False"]
        assert mine["optimizer"] == "DeviceStepBF16Optimizer"
        finite = [i for i in range(20) if i != nan_at]
        # the clip acted on every step (norm well above the clip), with the same norms
        assert min(ref["norms"][i] for i in finite) > 2e-2
        assert [mine["norms"][i] for i in finite] == pytest.approx(
            [ref["norms"][i] for i in finite], rel=1e-4)
        assert [mine["losses"][i] for i in finite] == pytest.approx(
            [ref["losses"][i] for i in finite], rel=1e-3)
        for a, b in zip(mine["master"], ref["master"]):    # fp32 master weights
            assert a == pytest.approx(b, rel=1e-4, abs=1e-6)
        for key in ("exp_avg", "exp_avg_sq"):
            for a, b in zip(mine[key], ref[key]):
                assert a == pytest.approx(b, rel=1e-3, abs=1e-9), key
        for name, values in ref["bf16"].items():
            assert mine["bf16"][name] == pytest.approx(values, rel=1e-2, abs=1e-5), name
        if nan_at is None:
            assert mine["adam_steps"] == ref["adam_steps"] == [20.0, 20.0]
            assert all(ref["applied"])
            continue
        # the NaN step: DeepSpeed skips it (norm reported as inf, step not applied); the
        # device step skips it on the device (the host learns later: applied stays True),
        # and neither counts it in Adam's step
        assert ref["norms"][nan_at] == mine["norms"][nan_at] == float("inf")
        assert ref["applied"][nan_at] is False and mine["applied"][nan_at] is True
        assert mine["adam_steps"] == ref["adam_steps"] == [19.0, 19.0]
        # the schedule held on the skip: the later updates used DeepSpeed's lrs (the weights
        # above agree) and the host's scheduler, once it read the skip, is where DeepSpeed's is
        assert mine["schedule_index"] == ref["schedule_index"] == 19
        assert mine["lr"] == pytest.approx(ref["lr"], rel=1e-6)
