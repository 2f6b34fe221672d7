"""SOHO's optimiser recipe inside a real DeepSpeed engine (one process, world size 1): the
client SgdAdamW replaces DeepSpeed's AdamW, the CNN stays put for the cold start and moves
after it under ZeRO-2, and a reloaded checkpoint restores the freeze."""

from __future__ import annotations

import math

import pytest

from engine_subprocess import run_one_rank

BODY = """
    from vlp.models import create_model
    from vlp.testing.example_batches import example_batch
    from vlp.platform.training import checkpointing
    from vlp.platform.training.engine import build_engine
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config

    out = {}
    for zero in (2,):   # ZeRO-2: flat fp32 groups whose frozen part gets zero gradients
        cfg = loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mvm": 1, "mlm": 1},
            "model": {"family": "soho-tiny", "cold_start_steps": 2},
            "train": {"steps": 4, "zero_stage": zero}, "optimizer": {"warmup_steps": 1}}))
        torch.manual_seed(0)
        model, spec, _ = create_model("soho-tiny", ["mvm", "mlm"])
        engine = build_engine(model, cfg, stage_steps=4, world_size=1)
        cnn = model.backbone.visual.resnet.conv1.weight
        rows = []
        for step in range(4):
            before = cnn.detach().clone()
            task = ("mvm", "mlm")[step % 2]
            loss = engine(example_batch(spec, task, seed=step), task=task)["loss"]
            engine.backward(loss)
            engine.step()
            rows.append({"moved": not torch.equal(before, cnn.detach()),
                         "lrs": [g["lr"] for g in engine.optimizer.param_groups]})
        with tempfile.TemporaryDirectory() as d:
            engine.lr_scheduler.last_epoch = 1    # as if saved inside the cold start
            checkpointing.save(engine, d, checkpointing.TrainerState(step=1, world_size=1), 0, {})
            model.backbone.visual.cnn_frozen = False
            checkpointing.load(engine, d, 0, 1)
        out[str(zero)] = {"basic": type(engine.basic_optimizer).__name__, "rows": rows,
                          "frozen_after_load": model.backbone.visual.cnn_frozen}
        engine.destroy()
    print("RESULT" + json.dumps(out))
"""


@pytest.mark.integration
def test_cold_start_and_sgd_in_a_deepspeed_engine(tmp_path):
    out = run_one_rank(BODY, cwd=tmp_path)
    for zero, r in out.items():
        assert r["basic"] == "SgdAdamW", zero
        assert [row["moved"] for row in r["rows"]] == [False, False, True, True], zero
        lrs = [row["lrs"] for row in r["rows"]]        # after each step: the next step's lrs
        assert lrs[0][2] == 0.0 and lrs[1][2] > 0, zero   # CNN group: 0 through step 2
        assert lrs[0][0] > 0, zero                        # the Transformer trains throughout
        assert r["frozen_after_load"], zero


# SOHO in reduced precision: DeepSpeed casts the parameters, not the buffers, so the
# ResNet's BatchNorm statistics stay fp32 beside bf16/fp16 weights and activations.
PRECISION_BODY = """
    from vlp.models import create_model
    from vlp.testing.example_batches import example_batch
    from vlp.platform.training import checkpointing
    from vlp.platform.training.engine import build_engine
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config

    from vlp.platform.training.cpu_precision import cpu_fp16_supported

    results = {"fp16_supported": cpu_fp16_supported()}
    for precision in sys.argv[2].split(","):
        # fp16 on CPU: the config refuses it without scaling.use_gpu (a guard for real runs);
        # DeepSpeed's CPU accelerator runs it, so the test sets the flag to get past it
        cfg = loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mvm": 1, "mlm": 1},
            "model": {"family": "soho-tiny", "cold_start_steps": 0},   # the CNN trains at once
            "train": {"steps": 2, "zero_stage": 2, "precision": precision},
            "optimizer": {"warmup_steps": 1}, "scaling": {"use_gpu": precision == "fp16"}}))
        torch.manual_seed(0)
        model, spec, _ = create_model("soho-tiny", ["mvm", "mlm"])
        if precision == "fp16" and not results["fp16_supported"]:
            try:
                build_engine(model, cfg, stage_steps=2, world_size=1)
                results[precision] = {"refused": None}
            except ValueError as e:
                results[precision] = {"refused": str(e)}
            continue
        engine = build_engine(model, cfg, stage_steps=2, world_size=1)
        bn = model.backbone.visual.resnet.bn1
        mean0 = bn.running_mean.clone()
        losses = []
        for step, task in enumerate(("mvm", "mlm")):
            loss = engine(example_batch(spec, task, seed=step), task=task)["loss"]
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        model.eval()
        with torch.no_grad():     # eval normalises with the running statistics
            evaluated = float(engine(example_batch(spec, "mlm", seed=5), task="mlm")["loss"])
        model.train()
        out = {"losses": losses, "eval_loss": evaluated, "weight": str(bn.weight.dtype),
               "stats": str(bn.running_mean.dtype),
               "stats_moved": not torch.equal(mean0, bn.running_mean)}
        with tempfile.TemporaryDirectory() as d:
            saved = {k: v.clone() for k, v in bn.state_dict().items()}
            checkpointing.save(engine, d, checkpointing.TrainerState(step=2, world_size=1), 0, {})
            with torch.no_grad():
                bn.running_mean.add_(1.0)
                bn.weight.add_(1.0)
            checkpointing.load(engine, d, 0, 1)
            out["reloaded"] = {k: [str(v.dtype), str(saved[k].dtype), torch.equal(v, saved[k])]
                               for k, v in bn.state_dict().items()}
        loss = engine(example_batch(spec, "mvm", seed=7), task="mvm")["loss"]
        engine.backward(loss)
        engine.step()
        out["loss_after_load"] = float(loss.detach())
        engine.destroy()
        results[precision] = out
    print("RESULT" + json.dumps(results))
"""


@pytest.mark.integration
def test_soho_trains_and_reloads_in_bf16_and_fp16(tmp_path):
    """bf16 everywhere (DeepSpeed's CPU accelerator always has it); fp16 where the CPU has
    fp16 kernels (AVX512-FP16/AMX-FP16, and torch not held below AVX-512 kernels by
    ATEN_CPU_CAPABILITY), else vlp's one-line refusal before DeepSpeed's own."""
    import torch

    from vlp.platform.training.cpu_precision import cpu_fp16_supported

    results = run_one_rank(PRECISION_BODY, "bf16,fp16", cwd=tmp_path)
    supported = results.pop("fp16_supported")
    assert supported == cpu_fp16_supported()          # the rank saw what this process sees
    if not supported:
        refused = results.pop("fp16")["refused"]
        assert refused is not None and refused.startswith("train.precision=fp16 on this CPU")
        assert torch.backends.cpu.get_cpu_capability() in refused
    for precision, dtype in (("bf16", "torch.bfloat16"), ("fp16", "torch.float16")):
        if precision not in results:
            continue
        out = results[precision]
        assert all(math.isfinite(x) for x in out["losses"] + [out["eval_loss"],
                                                              out["loss_after_load"]]), out
        assert out["weight"] == dtype, out              # DeepSpeed's cast, as before
        assert out["stats"] == "torch.float32", out     # the statistics stay fp32
        assert out["stats_moved"], out
        for name, (now, saved, equal) in out["reloaded"].items():
            assert now == saved and equal, (precision, name, out["reloaded"])
