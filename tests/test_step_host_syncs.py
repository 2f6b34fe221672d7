"""No device→host sync in the whole training step — forward, backward, the gradient
bookkeeping, clipping, the optimizer and the statistics — counted by the recorder of
test_forward_host_syncs.py (``vlp.platform.training.host_syncs``) around each of the loop's steps
(``loop._Worker._step``), bf16 under ZeRO-1 on DeepSpeed's real engine: the path a bf16 job
on one GPU takes.

With DeepSpeed's own ``BF16_Optimizer.step`` (the device step switched off) the same count
is 6 a step: four reads of the gradient norm in DeepSpeed (the skip test and the clip test),
a tensor it makes on the device from a Python value, and the statistics' ``tolist``. And
DeepSpeed's throughput timer, on unless its config says otherwise, synchronizes the device
at each forward and step (``engine.deepspeed_config`` turns it off). The device step (``device_step.py``) clips and skips on the
device, and the statistics are read two steps late (``pending_stats.py``).

A non-finite loss is still caught: the update of its step is skipped on the device, and the
loop raises when it reads that step's statistics.
"""

from __future__ import annotations

import pytest

from engine_subprocess import run_one_rank

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BODY = """
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training import engine as engine_mod, loop as loop_mod
    from vlp.platform.training.host_syncs import HostSyncRecorder
    from vlp.testing.toy import ToyComponents

    real_step = loop_mod._Worker._step
    syncs = []

    def recorded(self, state):
        with HostSyncRecorder() as rec:
            out = real_step(self, state)
        syncs.append([f"{e.what} at {e.where}" for e in rec.events])
        return out

    loop_mod._Worker._step = recorded

    ds_config = engine_mod.deepspeed_config

    def run(device_step, nan_at=0, ds_timers=False):
        syncs.clear()
        engine_mod.deepspeed_config = ds_config
        if ds_timers:   # DeepSpeed's default: its throughput timer on, synchronized
            def with_timers(*a, **kw):
                out = ds_config(*a, **kw)
                out.pop("timers")
                return out
            engine_mod.deepspeed_config = with_timers
        cfg = loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1, "mrfr": 1},
            "train": {"steps": 8, "precision": "bf16", "zero_stage": 1, "log_every": 3,
                      "grad_accum": 2},
            "optimizer": {"warmup_steps": 2, "lr": 1e-2, "grad_clip": 1e-3},
            "checkpoint": {"interval": 100}}))
        if not device_step:
            engine_mod.use_device_step = lambda optimizer: False
        worker = loop_mod._Worker(cfg, {"config": cfg, "components": ToyComponents(
            nan_at_call=nan_at), "tracking": {"enabled": False}, "run_dir": root})
        try:
            out = worker.run()
            result = {"steps": [h["step"] for h in out["history"]],
                      "grad_norms": [h.get("grad_norm") for h in out["history"]],
                      "examples": out["examples_seen"]}
        except FloatingPointError as e:
            result = {"error": str(e)}
        result.update(optimizer=type(worker.engine.optimizer).__name__, syncs=list(syncs))
        worker.engine.destroy()
        return result

    device = run(True)
    nan = run(True, nan_at=5)
    timers = run(True, ds_timers=True)
    deepspeed = run(False)
    print("RESULT" + json.dumps({"device": device, "deepspeed": deepspeed, "nan": nan,
                                 "timers": timers}))
"""


def test_the_whole_bf16_step_reads_nothing_back_from_the_device(tmp_path):
    out = run_one_rank(BODY, cwd=tmp_path, ray_train=True)
    device, deepspeed, nan, timers = out["device"], out["deepspeed"], out["nan"], out["timers"]
    assert device["optimizer"] == "DeviceStepBF16Optimizer"
    assert deepspeed["optimizer"] == "FlatBookkeepingBF16Optimizer"
    # every step's record, its statistics read late, the last ones at the end
    assert device["steps"] == deepspeed["steps"] == list(range(1, 9))
    assert device["examples"] == deepspeed["examples"] > 0
    assert all(n is not None and n > 0 for n in device["grad_norms"])
    # the recorder sees DeepSpeed's step: 4 norm reads, a tensor made on the device from a
    # Python value (in its norm), and the statistics' tolist, each step
    assert [len(s) for s in deepspeed["syncs"]] == [6] * 8, "\n".join(deepspeed["syncs"][0])
    # the device step: none, in any step (the first two read nothing yet; the others read
    # the statistics of two steps before)
    bad = [(i + 1, s) for i, s in enumerate(device["syncs"]) if s]
    assert not bad, bad
    # with DeepSpeed's throughput timer left on (its default), it synchronizes the device
    # at the forward and at the step from its third step on (a CPU runs it as nothing)
    waits = [sum("deepspeed accelerator synchronize" in e for e in s) for s in timers["syncs"]]
    assert all(waits[4:]), timers["syncs"]
    # a NaN batch (the 5th micro-batch: step 3): the loop raises when it reads step 3's
    # statistics, at step 5, and says the update was skipped
    assert "non-finite loss at step 3" in nan["error"], nan
    assert "skipped on the device" in nan["error"] and "read at step 5" in nan["error"]
