"""Integration: bf16 end to end through the training loop on CPU (``loop._Worker``: set-up,
the prefetcher's cast, a DeepSpeed bf16 ZeRO-2 engine, checkpoints through the loop's own
save and restore), stopped mid-stage and resumed: every step's loss after the resume and the
final weights are the uninterrupted run's, exactly. The toy model has dropout, so the loss
after the resume depends on the RNG state the checkpoint saved.

One process, one gloo rank, no Ray: ``ray.train``'s context, report and checkpoint are
stood in for (``engine_subprocess.RAY_TRAIN``: a checkpoint the loop reports is kept as Ray
Train would keep it, and handed back on the resume). The loop under Ray Train on 2 workers
(fp32): test_platform_train.py and test_pretrain_train.py."""

from __future__ import annotations

import pytest

from engine_subprocess import run_one_rank

# Budget: 90-194 s measured on a loaded 2-core machine (the suite's slowest); 480 s leaves room to
# rerun it on its own (`pytest tests/test_loop_bf16_resume.py`) while the machine is busy,
# and a hang fails here with pytest-timeout's stack dump instead of stalling `make test`.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

BODY = """
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training import loop as loop_mod
    from vlp.testing.toy import ToyComponents

    def run(*overrides):
        cfg = loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1, "mrfr": 1},
            "stages": [{"name": "one", "steps": 4}, {"name": "two", "steps": 4}],
            "train": {"precision": "bf16", "zero_stage": 2, "log_every": 1},
            "optimizer": {"warmup_steps": 2, "lr": 1e-2},
            "checkpoint": {"interval": 100}}, overrides=list(overrides)))
        worker = loop_mod._Worker(cfg, {"config": cfg, "components": ToyComponents(),
                                        "tracking": {"enabled": False}, "run_dir": root})
        out = worker.run()
        module = worker.engine.module
        weights = {k: v.float().tolist() for k, v in module.state_dict().items()}
        dtypes = sorted({str(p.dtype) for p in module.parameters()})
        worker.engine.destroy()
        return {"losses": {h["step"]: h["loss"] for h in out["history"]},
                "start": out["start_step"], "final": out["final_step"], "weights": weights,
                "dtypes": dtypes, "examples": out["examples_seen"]}

    straight = run()
    stopped = run("train.stop_after=3")
    restore[0] = ray.train.Checkpoint.from_directory(kept[-1])
    resumed = run()
    print("RESULT" + json.dumps({"straight": straight, "stopped": stopped,
                                 "resumed": resumed, "kept": [os.path.basename(k)
                                                              for k in kept]}))
"""


def test_bf16_through_the_loop_stops_and_resumes_exactly(tmp_path):
    out = run_one_rank(BODY, cwd=tmp_path, ray_train=True)
    straight, stopped, resumed = out["straight"], out["stopped"], out["resumed"]
    for r in (straight, stopped, resumed):
        assert r["dtypes"] == ["torch.bfloat16"]              # the engine trained in bf16
    assert (stopped["start"], stopped["final"]) == (0, 3)
    assert (resumed["start"], resumed["final"]) == (3, 8)
    # checkpoints at the stage ends and at the stop; the resume starts from the stop's
    assert out["kept"] == ["0-checkpoint_step00000004", "1-checkpoint_step00000008",
                           "2-checkpoint_step00000003",
                           "3-checkpoint_step00000004", "4-checkpoint_step00000008"]
    want = {int(k): v for k, v in straight["losses"].items()}
    assert sorted(want) == list(range(1, 9))
    assert {int(k): v for k, v in stopped["losses"].items()} == {s: want[s] for s in (1, 2, 3)}
    # after the resume (stage 1's last step, then stage 2 from stage 1's weights): the same
    # losses, bit for bit, and the same final weights
    assert {int(k): v for k, v in resumed["losses"].items()} == {s: want[s] for s in range(4, 9)}
    assert resumed["weights"] == straight["weights"]
    assert resumed["examples"] == straight["examples"]
