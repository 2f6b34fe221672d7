"""Integration: real pretraining (the shipped pretrain-tiny config, size overrides only, with
``data.stream: global``) checkpointed on 2 workers resumes on 1 (grad_accum 1 → 2), and that
run's checkpoint on 2 again (2 → 1), through the loop on real DeepSpeed ZeRO-1 engines and
gloo ranks, without Ray: each worker a process, the
local reader (the same batcher as Ray Data's stream; ``LocalPretrainComponents``), every
rank's checkpoint files merged into one folder as Ray Train merges them. Against the
uninterrupted 2-worker run: after the resume every step trains the same examples (by image
and caption key) with the same task per micro-batch, and each step's loss is the same within
rounding (the weights and Adam moments come through DeepSpeed's universal checkpoint;
dropout is off, since a resume on another world seeds the dropout streams anew)."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from engine_subprocess import rank_group
from preloaded_python import run_python
from vlp.platform.training import checkpointing

STEPS, CKPT, BACK = 6, 2, 4     # the 1-worker run stops at BACK; 2 workers go on
CONFIG = Path(__file__).parents[1] / "jobs" / "configs" / "pretrain-tiny.yaml"

RANK = textwrap.dedent("""
    import contextlib, json, os, shutil, sys
    import torch, torch.distributed as dist

    rank, world, port, world_dir, store, resume, stop = sys.argv[1:8]
    rank, world = int(rank), int(world)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    from vlp.datasets.batching.task_batch import EXAMPLE_IMAGE_KEY, EXAMPLE_TEXT_KEY
    from vlp.platform.pretrain.data import prepare
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.job import resolved
    from vlp.platform.pretrain.local import LocalPretrainComponents
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training import loop as loop_mod

    class Context:
        local_rank = rank
        def __init__(self):
            self.rank, self.world_size = rank, world
        def device(self, use_gpu):
            return torch.device("cpu")
        @contextlib.contextmanager
        def checkpoint_folder(self):
            yield resume or None
        def report(self, metrics, checkpoint_dir, dir_name):
            if checkpoint_dir is not None:   # every rank's files into one folder, as Ray does
                shutil.copytree(checkpoint_dir, os.path.join(store, dir_name),
                                dirs_exist_ok=True)

    seen = []   # per micro-batch this rank trained: its task and its examples' keys

    class Components(LocalPretrainComponents):
        def build_batch_source(self, cfg, stage, k, worker):
            source = super().build_batch_source(cfg, stage, k, worker)
            source._with_ids = True
            take = source.next
            def next(task):
                batch = take(task)
                pairs = zip(batch.pop(EXAMPLE_IMAGE_KEY).tolist(),
                            batch.pop(EXAMPLE_TEXT_KEY).tolist())
                seen.append([task, sorted(pairs)])
                return batch
            source.next = next
            return source

    overrides = [f"scaling.num_workers={world}", "data.stream=global", "model.dropout=0",
                 f"train.steps=%(steps)d", "optimizer.warmup_steps=2",
                 "checkpoint.interval=%(ckpt)d", "train.log_every=1",
                 "mlflow.enabled=false", f"run.output_dir={store}", "run.name=resume-world",
                 f"train.stop_after={stop}"]
    overrides += [f"data.sources.{s}.path={world_dir}/images/{s}"
                  for s in ("coco", "vg", "cc", "sbu")]
    cfg = resolved(load_experiment_config("%(config)s", overrides=overrides))
    loop = loop_config(cfg)
    worker = loop_mod._Worker(loop, {"config": loop, "components": Components(prepare(cfg)),
                                     "tracking": {"enabled": False}, "run_dir": store,
                                     "context": Context()})
    out = worker.run()
    gas = worker.engine.gradient_accumulation_steps()
    worker.engine.destroy()
    print("RESULT" + json.dumps({"losses": {h["step"]: h["loss"] for h in out["history"]},
                                 "gas": gas, "start": out["start_step"],
                                 "final": out["final_step"], "seen": seen}))
""") % {"steps": STEPS, "ckpt": CKPT, "config": CONFIG}


def run_ranks(world: int, cwd, world_dir, store: str, resume: str = "",
              stop: int = 0) -> list[dict]:
    with rank_group() as (port, env):
        procs = run_python(RANK, [[r, world, port, world_dir, store, resume, stop]
                                  for r in range(world)], env=env, cwd=cwd, timeout=600)
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
    return [json.loads(p.stdout.split("RESULT", 1)[1]) for p in procs]


def steps_of(ranks: list[dict], gas: int, first: int) -> dict[int, list]:
    """Per step (from ``first`` + 1): the tasks and the sorted example keys trained in it,
    over the ranks (each rank's micro-batches in order, ``gas`` to a step)."""
    out: dict[int, list] = {}
    for r in ranks:
        for i, micro in enumerate(r["seen"]):
            out.setdefault(first + 1 + i // gas, []).append(micro)
    return {s: sorted(map(json.dumps, micros)) for s, micros in out.items()}


def assert_continues(base: list[dict], resumed: list[dict], gas: int, first: int, last: int):
    """``resumed`` (grad_accum ``gas``) trained steps first+1..last with the uninterrupted
    2-worker run's examples, tasks and losses."""
    want = steps_of(base, 1, 0)
    got = steps_of(resumed, gas, first)
    assert sorted(got) == list(range(first + 1, last + 1))
    for s in got:   # the same examples, by key, and the same task in each micro-batch
        assert len(got[s]) == 2 and all(json.loads(m)[1] for m in got[s]), got[s]
        assert got[s] == want[s], s
    assert got[first + 1] != got[first + 2]
    losses = {int(k): v for k, v in base[0]["losses"].items()}
    for r in resumed:
        assert sorted(map(int, r["losses"])) == list(range(first + 1, last + 1))
        for s, loss in r["losses"].items():
            assert loss == pytest.approx(losses[int(s)], rel=1e-4), (s, loss, losses[int(s)])


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_real_pretraining_goes_from_two_workers_to_one_and_back(tiny_world, tmp_path):
    two, one, again = (str(tmp_path / n) for n in ("two", "one", "again"))
    base = run_ranks(2, tmp_path, tiny_world, two)
    assert sorted(steps_of(base, 1, 0)) == list(range(1, STEPS + 1))

    ckpt = os.path.join(two, f"checkpoint_{checkpointing.step_tag(CKPT)}")
    (mid,) = run_ranks(1, tmp_path, tiny_world, one, ckpt, stop=BACK)
    assert (mid["start"], mid["final"], mid["gas"]) == (CKPT, BACK, 2)   # grad_accum 1 → 2
    assert_continues(base, [mid], 2, CKPT, BACK)

    ckpt = os.path.join(one, f"checkpoint_{checkpointing.step_tag(BACK)}")
    back = run_ranks(2, tmp_path, tiny_world, again, ckpt)
    assert [(r["start"], r["final"], r["gas"]) for r in back] == [(BACK, STEPS, 1)] * 2
    assert_continues(base, back, 1, BACK, STEPS)
