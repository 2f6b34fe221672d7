"""The gradient all-reduce overlapped with the backward (``grad_exchange.py``,
``train.grad_overlap``) on two gloo ranks with DeepSpeed's real engine under bf16/ZeRO-1:
the same training as DeepSpeed's reduction after the backward (fp32 within rounding), with
ranks on different tasks (heads one rank's backward never reaches), accumulation over two
micro-batches and buckets small enough that there are many; the first bucket is launched
before the backward's last gradient is taken; bf16 on the wire stays close."""

from __future__ import annotations

import json
import textwrap

import pytest

from engine_subprocess import rank_group
from preloaded_python import run_python

RANK_BODY = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist

    rank, port = int(sys.argv[1]), sys.argv[2]
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)

    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training.engine import build_engine
    from vlp.testing.toy import ToyBatchSource, ToyModel

    GAS, STEPS = 2, 3
    # rank 0 and rank 1 on different tasks in some micro-batches, the boundary's included
    TASKS = [["itm", "mrfr"], ["mrfr", "itm"], ["itm", "itm"], ["mrfr", "mrfr"],
             ["itm", "mrfr"], ["mrfr", "mrfr"]]

    def train(overlap, wire="fp32"):
        cfg = loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"itm": 1, "mrfr": 1},
            "train": {"steps": STEPS, "precision": "bf16", "zero_stage": 1,
                      "grad_accum": GAS, "grad_overlap": overlap,
                      "grad_bucket_elements": 100, "grad_wire_dtype": wire},
            "optimizer": {"warmup_steps": 1, "lr": 1e-2, "grad_clip": 1.0}}))
        torch.manual_seed(0)
        model = ToyModel(["itm", "mrfr"], dim=32, hidden=64)
        engine = build_engine(model, cfg, stage_steps=STEPS, world_size=2)
        ex = getattr(engine.optimizer, "_vlp_exchange", None)
        src = ToyBatchSource(32, 0, rank, 0)
        losses, launches = [], []
        for micro in range(GAS * STEPS):
            task = TASKS[micro][rank]
            b = {k: v.bfloat16() if v.is_floating_point() else v
                 for k, v in src.next(task).items()}
            loss = engine(b, task=task)["loss"]
            engine.backward(loss)
            if ex is not None and (micro + 1) % GAS == 0:
                launches.append([list(ex.stats.hooks_at_launch), ex.stats.hooks])
                ex.stats.hooks_at_launch.clear(); ex.stats.hooks = 0
            engine.step()
            losses.append(float(loss))
        weights = torch.cat([p.detach().float().flatten() for p in model.parameters()])
        master = torch.cat([p.detach().flatten()
                            for p in engine.optimizer.fp32_groups_flat_partition])
        out = {"losses": losses, "weights": weights.tolist(), "master": master.tolist(),
               "exchange": ex is not None, "launches": launches,
               "buckets": len(ex.buckets) if ex else 0,
               "allreduce": engine.enable_backward_allreduce}
        engine.destroy()
        return out

    result = {"off": train(False), "on": train(True), "bf16": train(True, "bf16")}
    print("RESULT" + json.dumps(result))
""")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("overlap")
    with rank_group() as (port, env):
        procs = run_python(RANK_BODY, [[r, port] for r in (0, 1)], env=env, cwd=cwd,
                           timeout=600)
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads(p.stdout.split("RESULT", 1)[1]) for p in procs]


def _close(a, b, rtol, atol):
    import torch

    return torch.allclose(torch.tensor(a), torch.tensor(b), rtol=rtol, atol=atol)


@pytest.mark.integration
def test_overlapped_exchange_trains_as_deepspeeds_reduction(ranks):
    for r in ranks:
        off, on = r["off"], r["on"]
        assert not off["exchange"] and off["allreduce"]
        assert on["exchange"] and not on["allreduce"] and on["buckets"] > 3
        # fp32 sums in another order at most: rounding, not a different step
        assert _close(on["losses"], off["losses"], 1e-5, 1e-6), (on["losses"], off["losses"])
        assert _close(on["master"], off["master"], 1e-5, 1e-6)
        assert _close(on["weights"], off["weights"], 1e-2, 1e-3)   # their bf16 copies
    # the ranks hold the same weights (their collectives paired, whatever their tasks)
    assert ranks[0]["on"]["weights"] == ranks[1]["on"]["weights"]


@pytest.mark.integration
def test_buckets_start_during_the_backward(ranks):
    for r in ranks:
        assert len(r["on"]["launches"]) == 3
        for at_launch, hooks in r["on"]["launches"]:
            assert len(at_launch) == r["on"]["buckets"]
            # the first bucket went out while later hooks (earlier layers) were still to come
            assert at_launch[0] < hooks, (at_launch, hooks)


@pytest.mark.integration
def test_bf16_on_the_wire_stays_close(ranks):
    for r in ranks:
        assert r["bf16"]["exchange"]
        assert _close(r["bf16"]["losses"], r["off"]["losses"], 2e-2, 1e-3)


def test_start_line_says_where_the_exchange_overlaps():
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training.engine import deepspeed_config, gradient_line, overlaps_exchange

    def cfg(**train):
        return loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1},
            "train": {"steps": 2, **train}, "optimizer": {"warmup_steps": 1}}))

    bf16 = cfg(precision="bf16")
    ds = deepspeed_config(bf16, 2)
    assert overlaps_exchange(ds, bf16, 2)
    assert "in buckets during the last backward" in gradient_line(ds, overlap=True)
    assert "reduce in bf16" in gradient_line(ds, overlap=True, wire="bf16")
    assert not overlaps_exchange(deepspeed_config(bf16, 1), bf16, 1)     # one rank
    off = cfg(precision="bf16", grad_overlap=False)
    assert not overlaps_exchange(deepspeed_config(off, 2), off, 2)
    fp32 = cfg(precision="fp32")          # DeepSpeed's ZeRO optimizer: its own reduction
    assert not overlaps_exchange(deepspeed_config(fp32, 2), fp32, 2)
    assert gradient_line(deepspeed_config(fp32, 2)).endswith("over 1 micro-batch(es)")
