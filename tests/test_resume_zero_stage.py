"""Integration: a checkpoint written by a one-worker run under the old default (ZeRO-2 on one
worker, no ZeRO stage in its meta) resumes under today's default (``train.zero_stage: auto``,
no ZeRO on one worker) through the loop on a real DeepSpeed engine: the run takes the
checkpoint's stage, and every loss after the resume and the final weights are the
uninterrupted run's, exactly (Adam's moments came back). A checkpoint without ZeRO, resumed
with an explicit ``train.zero_stage=2``, fails in set-up with one line naming the setting.
Without DeepSpeed: the stage read from a checkpoint's meta or, for one written before the
meta recorded it, from its files, and the driver's check before any worker starts."""

from __future__ import annotations

import json

import pytest

from engine_subprocess import run_one_rank
from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.pretrain.run import loop_config
from vlp.platform.training import checkpointing, launch

ZERO_FILE = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def write_checkpoint(run_dir, files, **meta):
    """A checkpoint folder of a one-worker run at step 3, with these DeepSpeed files."""
    folder = run_dir / "checkpoint_step00000003"
    (folder / "step00000003").mkdir(parents=True)
    for name in files:
        (folder / "step00000003" / name).write_bytes(b"")
    (folder / checkpointing.META_FILE).write_text(json.dumps({
        "step": 3, "stage": 0, "tag": "step00000003", "stages": [["one", 6]],
        "world_size": 1, **meta}))
    return folder


def loop(tmp_path, *overrides):
    return loop_config(load_experiment_config(data={
        "data": {"sources": {"a": {"path": "/x"}}}, "stages": [{"name": "one", "steps": 6}],
        "optimizer": {"warmup_steps": 2}, "scaling": {"num_workers": 1},
        "run": {"name": "job", "storage": str(tmp_path)}}, overrides=list(overrides)))


@pytest.mark.parametrize("files, meta, stage", [
    ([ZERO_FILE], {}, 2),                             # before the meta recorded it: ZeRO
    (["bf16_" + ZERO_FILE], {}, 2),                   # DeepSpeed's name in bf16
    ([], {}, 0),                                      # the optimizer state in the module file
    ([ZERO_FILE], {"zero_stage": 1}, 1),              # recorded: the meta says
])
def test_the_stage_a_checkpoint_was_written_with(tmp_path, files, meta, stage):
    files = ["mp_rank_00_model_states.pt", *files]
    folder = write_checkpoint(tmp_path / "job", files, **meta)
    assert checkpointing.read_meta(folder)["zero_stage"] == stage
    # auto follows the checkpoint; an explicit stage stays
    read = checkpointing.read_meta(folder)
    assert checkpointing.follow_checkpoint(loop(tmp_path), read).train.zero_stage == stage
    explicit = loop(tmp_path, "train.zero_stage=1")
    assert checkpointing.follow_checkpoint(explicit, read) is explicit


def test_the_driver_refuses_a_zero_stage_that_cannot_load_the_checkpoint(tmp_path):
    """An old one-worker ZeRO-2 checkpoint (no stage in its meta): auto and either ZeRO stage
    resume it (stages 1 and 2 load each other's state); stage 0 is refused in one line that
    says what to set. The reverse for a checkpoint without ZeRO."""
    write_checkpoint(tmp_path / "job", ["mp_rank_00_model_states.pt", ZERO_FILE])
    for ok in ("auto", "1", "2"):
        assert launch.resume_problem(loop(tmp_path, f"train.zero_stage={ok}")) is None, ok
    problem = launch.resume_problem(loop(tmp_path, "train.zero_stage=0"))
    assert problem.startswith("run 'job' in ") and "\n" not in problem
    assert "written with ZeRO stage 2" in problem and "train.zero_stage=0 cannot" in problem
    assert "--set train.zero_stage=2" in problem

    write_checkpoint(tmp_path / "plain" / "job", ["mp_rank_00_model_states.pt"])
    assert launch.resume_problem(loop(tmp_path / "plain")) is None
    problem = launch.resume_problem(loop(tmp_path / "plain", "train.zero_stage=2"))
    assert "written with ZeRO stage 0" in problem and "--set train.zero_stage=0" in problem

BODY = """
    from vlp.platform.pretrain.experiment_config import load_experiment_config
    from vlp.platform.pretrain.run import loop_config
    from vlp.platform.training import checkpointing, loop as loop_mod
    from vlp.platform.training.failures import SetupError
    from vlp.testing.toy import ToyComponents

    def run(*overrides):
        cfg = loop_config(load_experiment_config(data={
            "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1, "mrfr": 1},
            "stages": [{"name": "one", "steps": 6}], "train": {"log_every": 1},
            "optimizer": {"warmup_steps": 2, "lr": 1e-2}, "checkpoint": {"interval": 100}},
            overrides=list(overrides)))
        worker = loop_mod._Worker(cfg, {"config": cfg, "components": ToyComponents(),
                                        "tracking": {"enabled": False}, "run_dir": root})
        try:
            out = worker.run()
        except SetupError as e:
            return {"error": str(e)}
        module = worker.engine.module
        stage = worker.engine.zero_optimization_stage()
        worker.engine.destroy()
        return {"losses": {h["step"]: h["loss"] for h in out["history"]}, "zero": stage,
                "weights": {k: v.tolist() for k, v in module.state_dict().items()}}

    straight = run("train.zero_stage=2")          # the old default on one worker
    stopped = run("train.zero_stage=2", "train.stop_after=3")
    meta_path = os.path.join(kept[-1], checkpointing.META_FILE)
    meta = json.load(open(meta_path))
    recorded = meta.pop("zero_stage", None)
    json.dump(meta, open(meta_path, "w"))         # as written before the meta recorded it
    restore[0] = ray.train.Checkpoint.from_directory(kept[-1])
    resumed = run()                               # today's default: auto
    restore[0] = None
    no_zero = run("train.stop_after=3")           # auto: no ZeRO on one worker
    restore[0] = ray.train.Checkpoint.from_directory(kept[-1])
    refused = run("train.zero_stage=2")
    print("RESULT" + json.dumps({"straight": straight, "stopped": stopped, "resumed": resumed,
                                 "recorded": recorded, "no_zero": no_zero,
                                 "refused": refused}))
"""


@pytest.mark.integration
def test_an_old_default_zero2_checkpoint_resumes_exactly_under_auto(tmp_path):
    out = run_one_rank(BODY, cwd=tmp_path, ray_train=True)
    straight, stopped, resumed = out["straight"], out["stopped"], out["resumed"]
    assert resumed.get("error") is None, resumed["error"]
    assert out["recorded"] == 2                     # the meta records the stage now
    assert straight["zero"] == stopped["zero"] == 2
    assert resumed["zero"] == 2                     # auto took the checkpoint's stage
    assert sorted(stopped["losses"]) == ["1", "2", "3"]
    assert resumed["losses"] == {s: straight["losses"][s] for s in ("4", "5", "6")}
    assert resumed["weights"] == straight["weights"]
    assert out["no_zero"]["zero"] == 0
    error = out["refused"]["error"]
    assert "\n" not in error
    assert "written with ZeRO stage 0" in error and "train.zero_stage=2 cannot load" in error
    assert "--set train.zero_stage=0" in error
