"""Gradient communication of DeepSpeed's real engine, as ``build_engine`` configures it, on
two gloo ranks (two processes, no Ray): with 4 micro-batches per optimizer step and the
default ZeRO stage, gradients are reduced once per step (no collective before the last
micro-batch), and under bf16 they are accumulated and reduced in fp32."""

from __future__ import annotations

import json
import textwrap

import pytest

from engine_subprocess import rank_group
from preloaded_python import run_python

RANK_BODY = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist

    rank, port, combo = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)

    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training import engine as engine_module
    from vlp.platform.training.engine import build_engine, deepspeed_config
    from vlp.testing.toy import ToyBatchSource, ToyModel

    # every collective that can carry gradients, at the torch.distributed level (DeepSpeed's
    # comm backend calls these by attribute)
    calls = []
    def counting(name, real):
        def wrapper(tensor, *a, **k):
            t = tensor[0] if isinstance(tensor, (list, tuple)) else tensor
            calls.append((name, int(t.numel()), str(t.dtype).replace("torch.", "")))
            return real(tensor, *a, **k)
        return wrapper
    for name in ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor",
                 "_reduce_scatter_base", "all_reduce_coalesced"):
        if hasattr(dist, name):
            setattr(dist, name, counting(name, getattr(dist, name)))

    precision, gas = combo
    cfg = loop_config(load_experiment_config(data={
        "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1},
        "train": {"steps": 2, "precision": precision, "grad_accum": gas},
        "optimizer": {"warmup_steps": 1, "lr": 1e-3, "grad_clip": 0}}))
    torch.manual_seed(0)
    model = ToyModel(["mlm"], dim=64, hidden=256)
    n = sum(p.numel() for p in model.parameters())
    engine = build_engine(model, cfg, stage_steps=2, world_size=2)
    src = ToyBatchSource(64, 0, rank, 0)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    per_micro = []
    for step in range(2):
        for micro in range(gas):
            calls.clear()
            b = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in
                 src.next("mlm").items()}
            loss = engine(b, task="mlm")["loss"]
            engine.backward(loss)
            engine.step()
            per_micro.append(list(calls))
    model_dtype, accum_dtype = engine.get_data_types()
    out = {"per_micro": per_micro, "parameters": n, "global_steps": engine.global_steps,
           "stage": int(engine.zero_optimization_stage()),
           "optimizer": type(engine.optimizer).__name__,
           "accum_dtype": str(accum_dtype).replace("torch.", ""),
           "comm_dtype": str(engine.communication_data_type).replace("torch.", ""),
           "line": engine_module.gradient_line(deepspeed_config(cfg, 2, num_parameters=n))
           if hasattr(engine_module, "gradient_line") else ""}
    # the buffer the bf16 optimizer accumulates micro-batch gradients into
    flat = getattr(engine.optimizer, "fp32_groups_gradients_flat", None)
    if flat:
        out["accum_buffer_dtype"] = str(flat[0].dtype).replace("torch.", "")
    engine.destroy()
    if rank == 0:
        print("RESULT" + json.dumps(out))
""")


def run_two_ranks(combo, cwd, timeout: float = 300) -> dict:
    with rank_group() as (port, env):
        procs = run_python(RANK_BODY, [[r, port, json.dumps(combo)] for r in (0, 1)],
                           env=env, cwd=cwd, timeout=timeout)
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(procs[0].stdout.split("RESULT", 1)[1])


def gradient_calls(calls, parameters):
    """Collectives large enough to carry gradients (not a loss scaler's overflow flag or a
    norm: those are a handful of elements)."""
    return [c for c in calls if c[1] >= min(1024, parameters // 4)]


GAS = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each precision's run, once for the module (two DeepSpeed processes each)."""
    cache: dict[str, dict] = {}

    def get(precision: str) -> dict:
        if precision not in cache:
            cache[precision] = run_two_ranks([precision, GAS], tmp_path_factory.mktemp(precision))
        return cache[precision]
    return get


@pytest.mark.integration
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_one_gradient_reduction_per_optimizer_step_under_accumulation(precision, runs):
    gas = GAS
    r = runs(precision)
    print(r["line"])
    assert r["global_steps"] == 2 and len(r["per_micro"]) == 2 * gas
    for i, calls in enumerate(r["per_micro"]):
        grads = gradient_calls(calls, r["parameters"])
        if (i + 1) % gas:
            assert not grads, f"micro-batch {i % gas + 1} of {gas} reduced gradients: {calls}"
        else:
            assert grads, f"the step's last micro-batch reduced nothing: {calls}"
            # once per step: every element reduced once (buckets, not one call per tensor)
            assert sum(c[1] for c in grads) <= 2 * r["parameters"], grads
    assert r["stage"] == 1
    assert "once per optimizer step" in r["line"]


@pytest.mark.integration
def test_bf16_accumulates_and_reduces_gradients_in_fp32(runs):
    r = runs("bf16")
    assert r["accum_dtype"] == "float32" and r["comm_dtype"] == "float32"
    assert r.get("accum_buffer_dtype") == "float32", r["optimizer"]
    boundary = gradient_calls(r["per_micro"][3], r["parameters"])
    assert boundary and all(c[2] == "float32" for c in boundary), boundary
    assert "accumulate in fp32, reduce in fp32" in r["line"]
