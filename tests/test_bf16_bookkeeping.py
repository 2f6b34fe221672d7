"""bf16 under ZeRO-1 (DeepSpeed's BF16_Optimizer): the flat bookkeeping
(``bf16_bookkeeping.use_flat_bookkeeping``, switched on by ``build_engine``) trains as
DeepSpeed's own per-parameter bookkeeping does — alternating tasks, so that some
parameters have no gradient in a step, and a clip small enough to act on every step — with
a fraction of the host's operations after backward and in the step."""

from __future__ import annotations

import pytest

from engine_subprocess import run_one_rank

BODY = """
    import collections, itertools, json
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training.engine import build_engine
    from vlp.testing.toy import ToyBatchSource, ToyModel

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()
            self.copy_fast = []   # each foreach copy meets CUDA's multi-tensor conditions
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket).removeprefix("aten.")
            self.ops[name] += 1
            if name == "_foreach_copy_":
                dst, src = args[0], args[1]
                self.copy_fast.append(
                    len({t.dtype for t in dst}) == len({t.dtype for t in src}) == 1
                    and len({t.device for t in [*dst, *src]}) == 1
                    and all(d.shape == s.shape and d.stride() == s.stride()
                            for d, s in zip(dst, src)))
            return func(*args, **(kwargs or {}))

    tasks = ["itm", "mrfr", "mrfr", "itm", "mrfr", "itm", "itm", "mrfr"]
    out = {}
    for gas, flat in itertools.product((1, 2), (True, False)):
        cfg = loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"itm": 1, "mrfr": 1},
            "train": {"steps": len(tasks) // gas, "zero_stage": 1, "precision": "bf16",
                      "grad_accum": gas},
            "optimizer": {"warmup_steps": 1, "lr": 1e-2, "grad_clip": 1e-3}}))
        torch.manual_seed(0)
        engine = build_engine(ToyModel(["itm", "mrfr"]), cfg,
                              stage_steps=len(tasks) // gas, world_size=1)
        name = type(engine.optimizer).__name__
        if not flat:   # DeepSpeed's own bookkeeping, for the reference
            engine.optimizer.__class__ = BF16_Optimizer
        src = ToyBatchSource(16, 0, 0, 0)
        backward, step, norms, copy_fast = collections.Counter(), collections.Counter(), [], []
        schedule = collections.Counter()
        if flat:   # the device step's lr schedule (a skip must not advance it) counted apart:
            # DeepSpeed's reference takes its lr from the host; this test weighs bookkeeping
            device_lrs = engine.optimizer._device_lrs
            def counted_lrs(device_lrs=device_lrs, schedule=schedule):
                with Ops() as c:
                    device_lrs()
                schedule.update(c.ops)
            engine.optimizer._device_lrs = counted_lrs
        for i, task in enumerate(tasks):
            batch = {k: v.bfloat16() if torch.is_tensor(v) and v.is_floating_point() else v
                     for k, v in src.next(task).items()}
            loss = engine(batch, task=task)["loss"]
            with Ops() as c:
                engine.backward(loss)
            backward += c.ops
            copy_fast += c.copy_fast
            with Ops() as c:
                engine.step()
            step += c.ops
            if i % gas == gas - 1:   # the step was taken
                norms.append(float(engine.get_global_grad_norm()))
        n_tensors = sum(len(g) for g in engine.optimizer.bf16_groups)
        out[f"{gas} {flat}"] = {
            "optimizer": name, "n_tensors": n_tensors, "norms": norms,
            "backward_ops": sum(backward.values()),
            "step_ops": sum(step.values()) - sum(schedule.values()),
            "schedule_ops": sum(schedule.values()),
            "step_norms": step["linalg_vector_norm"], "backward_casts": backward["_to_copy"],
            "foreach_copy": backward["_foreach_copy_"], "foreach_add": backward["_foreach_add_"],
            "copy_fast": copy_fast, "params": {k: v.detach().float().flatten().tolist()
                                               for k, v in engine.module.state_dict().items()}}
        engine.destroy()
    print("RESULT" + json.dumps(out))
"""


@pytest.mark.integration
def test_flat_bookkeeping_trains_as_deepspeeds_with_fewer_host_operations(tmp_path):
    out = run_one_rank(BODY, cwd=tmp_path)
    for gas in (1, 2):   # steps of one micro-batch, and of two (the second adds to the first)
        flat, own = out[f"{gas} True"], out[f"{gas} False"]
        # the flat bookkeeping, stepped on the device (device_step.py) on top of it
        assert flat["optimizer"] == "DeviceStepBF16Optimizer"
        # the clip acted on every step (norm above 1e-3), in both, with the same norms
        assert len(own["norms"]) == 8 // gas and min(own["norms"]) > 1e-3
        assert flat["norms"] == pytest.approx(own["norms"], rel=1e-5), gas
        for name, values in own["params"].items():   # bf16 weights after 8 // gas steps: equal
            assert values == pytest.approx(flat["params"][name], rel=1e-3, abs=1e-6), (gas, name)
        # the norm over the two flat buffers (decay / no decay), not one per parameter tensor
        # (DeepSpeed's: one per tensor with a gradient in the step, 6 of the toy's 8 at least)
        steps = 8 // gas
        assert own["step_norms"] >= steps * 6 and flat["step_norms"] <= steps * 2, (own, flat)
        # after backward: the bf16 → fp32 cast inside the multi-tensor operations, not one
        # per tensor
        assert own["backward_casts"] - flat["backward_casts"] >= 8 * 6, (own, flat)
        assert flat["schedule_ops"] > 0 and own["schedule_ops"] == 0   # counted apart
        assert flat["step_ops"] < own["step_ops"] and flat["backward_ops"] < own["backward_ops"]
        # a micro-batch that starts a step copies into the zeroed views, each copy one that
        # CUDA runs as multi-tensor kernels (one dtype per list, the same sizes and strides);
        # only the second micro-batch of a step adds (the task changes, so it adds into the
        # views the first one filled and copies into the others)
        assert flat["foreach_copy"] >= 8 // gas and all(flat["copy_fast"]), flat["copy_fast"]
        assert (flat["foreach_add"] == 0) if gas == 1 else (flat["foreach_add"] >= 8 // gas)
