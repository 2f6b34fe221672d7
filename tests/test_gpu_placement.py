"""vlp/platform/training/gpu_placement.py: the one device a GPU worker and DeepSpeed use, and
the allocator setting; then on a Ray with fake GPUs (num_gpus and an accelerator_type resource
on this CPU machine, gloo): Ray Train workers' LOCAL_RANK, device index and
CUDA_VISIBLE_DEVICES entry agree, DeepSpeed is handed that device, extraction actors hold
distinct GPUs, and every one of those processes got the allocator setting from vlp; on the same
Ray, `vlp data extract` refuses `--gpus 3` before any actor starts, naming both numbers, and
with `--gpus 1` its actor, which sees no CUDA, ends the job with one line instead of
extracting on the CPU while holding the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vlp.platform.training.gpu_placement import (ALLOC_SETTING, ALLOC_VAR, ALLOC_VARS,
                                                 Placement, allocator_env, deepspeed_args,
                                                 set_allocator)

ROOT = Path(__file__).resolve().parents[1]


def placed(**kw) -> Placement:
    base = dict(rank=1, local_rank=1, env_local_rank="1", device_index=1, visible=("0", "1"),
                gpu_ids=("1",))
    return Placement(**{**base, **kw})


def test_a_worker_whose_rank_device_and_gpu_agree_has_no_problem():
    assert placed().problem() is None
    assert placed(visible=("4", "6"), gpu_ids=("6",)).problem() is None


@pytest.mark.parametrize("change, words", [
    (dict(gpu_ids=()), "no GPU"),
    (dict(gpu_ids=("0", "1")), "GPUs 0, 1"),
    (dict(device_index=0), "CUDA_VISIBLE_DEVICES entry '0'"),
    (dict(visible=()), "(unset)"),
    (dict(env_local_rank="0"), "LOCAL_RANK is '0'"),
    (dict(local_rank=0, env_local_rank="0"), "did not order"),
])
def test_each_disagreement_is_one_line_naming_it(change, words):
    problem = placed(**change).problem()
    assert problem and words in problem and "\n" not in problem
    assert problem.startswith("rank 1")


def test_deepspeed_is_handed_vlps_device_on_a_gpu_and_nothing_elsewhere():
    assert deepspeed_args(torch.device("cuda:3")).device_rank == 3
    assert deepspeed_args(torch.device("cpu")) is None and deepspeed_args(None) is None


def test_the_allocator_setting_is_ours_unless_the_user_set_one_under_either_name():
    env: dict = {}
    set_allocator(env)
    assert env == {ALLOC_VAR: ALLOC_SETTING} and allocator_env(env) == env
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        env = {name: "max_split_size_mb:64"}
        set_allocator(env)
        assert env == {name: "max_split_size_mb:64"} and allocator_env(env) == env
    assert allocator_env({}) == {ALLOC_VAR: ALLOC_SETTING}


def test_where_cuda_has_started_the_running_allocator_is_set_too(monkeypatch):
    """A Ray Train worker's CUDA starts before the train function (Ray sets the device),
    when the allocator has read its variable: the setting then goes to the running allocator
    as well; not where the user set one, nor before CUDA starts."""
    from vlp.platform.training import gpu_placement

    applied = []
    monkeypatch.setattr(gpu_placement, "running_allocator_settings", lambda: applied.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ALLOC_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    set_allocator()
    assert applied == []
    monkeypatch.delenv(ALLOC_VAR)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    set_allocator()
    assert applied == [ALLOC_SETTING]
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")
    set_allocator()
    assert applied == [ALLOC_SETTING]


def test_this_torch_has_the_call_that_sets_the_running_allocator():
    from vlp.platform.training.gpu_placement import running_allocator_settings

    assert callable(running_allocator_settings())


def test_a_tune_trial_sets_the_allocator_before_anything_else(monkeypatch):
    from vlp.platform.sweep.trial import run_trial

    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(KeyError):          # an empty config: fails once the setting is made
        run_trial({}, None)
    assert os.environ[ALLOC_VAR] == ALLOC_SETTING


def test_on_fake_gpus_train_workers_kept_groups_and_extraction_actors_are_placed(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i in range(2):
        Image.fromarray(np.full((40, 60, 3), 60 * i, np.uint8)).save(imgs / f"{i}.jpg")
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fake_gpu_placement_jobs.py"),
                           str(tmp_path), str(imgs)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _the_extract_refusals(proc, tmp_path / "extract-out")
    alloc = {ALLOC_VAR: ALLOC_SETTING}
    train = [json.loads((tmp_path / f"train-{r}.json").read_text()) for r in (0, 1)]
    for seen in train:
        assert seen["visible"] == "0,1" and seen["backend"] == "gloo"
        index = int(seen["device"].split(":")[1])
        assert seen["local_rank"] == int(seen["env_local_rank"]) == index
        assert seen["visible_entry"] == seen["gpu_ids"][0] == seen["visible"].split(",")[index]
        assert seen["deepspeed_device_rank"] == index
        assert seen["alloc"] == alloc
    assert {s["gpu_ids"][0] for s in train} == {"0", "1"}
    # a kept worker group's ranks see both of the node's GPUs, as Ray Train's do, each
    # computing on the one Ray gave it
    group = json.loads((tmp_path / "group.json").read_text())
    assert [g["visible"] for g in group] == ["0,1", "0,1"], group
    for g in group:
        assert len(g["gpu_ids"]) == 1 and g["visible"].split(",")[g["device_index"]] == \
            g["gpu_ids"][0]
    assert {g["gpu_ids"][0] for g in group} == {"0", "1"}
    actors = [json.loads(p.read_text()) for p in tmp_path.glob("extract-*.json")]
    assert len(actors) == 2, actors
    for seen in actors:
        assert len(seen["gpu_ids"]) == 1 and seen["visible"] == seen["gpu_ids"][0]
        assert seen["alloc"] == alloc
        # torch here is a CPU build: the actor refuses its fake GPU (no silent CPU fallback)
        assert f"Ray GPU ids ['{seen['gpu_ids'][0]}']" in seen["refused"], seen["refused"]
    assert {s["gpu_ids"][0] for s in actors} == {"0", "1"}


def _the_extract_refusals(proc, out):
    codes = [ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("EXIT ")]
    assert codes == ["2", "1"], proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("vlp data extract: error")]
    assert len(errors) == 2, proc.stderr[-3000:]
    assert "--gpus 3: the Ray cluster has 2 GPU(s)" in errors[0]
    assert "a model actor was given a GPU but torch sees no CUDA device" in errors[1]
    assert "CUDA_VISIBLE_DEVICES=" in errors[1]
    shards = out / "images" / "x"
    assert not (shards.exists() and list(shards.glob("*.parquet"))), "extracted on the CPU"
