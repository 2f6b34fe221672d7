"""The world-text init on a multi-node cluster: with the sweep's storage a URI (s3://, moto's
server here) the text-only weights are trained once on the driver and copied into the
storage, the resolved config names their URI, and every reader (the preflight, a trial's
pretraining init, the finetune's text-init checkpoint) fetches them from there into its
node's cache, with the driver's local folder gone. A second driver reuses them. No Ray."""

from __future__ import annotations

import functools
import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from vlp.platform.sweep import load_sweep_config
from vlp.platform.sweep import text_init as text_init_module
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.sweep.space import init_problem
from vlp.platform.pretrain.data import prepare
from vlp.platform.sweep.trial_configs import (model_init, pretrain_config, resolve_text_init,
                                              text_init_checkpoint)

CONFIG = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "sweep-tiny.yaml"
STORAGE = "s3://sweeps/vlp"
WORD = "backbone.text_embeddings.word_embeddings.weight"


@pytest.fixture
def node_env(s3_env, monkeypatch):
    s3_env.create_bucket("sweeps")
    monkeypatch.setenv("VLP_STORAGE", STORAGE)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://head:5000")     # as on a cluster
    # a few steps: what is tested is where the weights go, not how good they are
    monkeypatch.setattr(text_init_module, "make_text_init", functools.partial(
        text_init_module.make_text_init, steps=2, batch_size=8))
    return s3_env


def sweep_config(driver: Path, world: Path):
    return load_sweep_config(CONFIG, [f"sweep.output_dir={driver}", f"world={world}",
                                      "model.text_init=world-text"]).resolved()


def test_world_text_weights_live_in_the_sweeps_storage_and_are_read_by_uri(
        node_env, tiny_world, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from vlp.platform.cluster.run_storage import open_location
    from vlp.platform.training.pretrained_weights import fetch

    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "driver-cache"))
    cfg = sweep_config(tmp_path / "driver", tiny_world)
    lines: list[str] = []
    out = resolve_text_init(cfg, [TrialPoint(init="text")], say=lines.append)
    tag = hashlib.sha1(cfg.world.encode()).hexdigest()[:8]
    uri = f"{STORAGE}/text-init/uniter-tiny-{tag}/model.safetensors"
    assert out.model.text_init == f"bert:{uri}"
    weights = open_location(uri.rsplit("/", 1)[0])
    assert weights.exists("model.safetensors") and weights.exists("config.json")
    assert init_problem("text", "uniter-tiny", out.model.text_init) is None     # preflight
    point = TrialPoint.of({"mlm": 1.0}, init="text")
    assert model_init(out, point) == {"init": "bert", "init_path": uri}

    # a trial on another node: the driver's folder is not there, its cache is empty
    shutil.rmtree(tmp_path / "driver")
    monkeypatch.setenv("VLP_CACHE", str(tmp_path / "node-cache"))
    saved = load_file(fetch(uri))
    checkpoint = text_init_checkpoint(out)
    assert checkpoint == f"{STORAGE}/{cfg.sweep.name}/text-init/model.pt"
    state = torch.load(fetch(checkpoint), map_location="cpu", weights_only=True)
    assert torch.equal(state[WORD], saved["bert.embeddings.word_embeddings.weight"])
    # the trial's pretraining preflight reads its init_path (the URI) and fits it to the model
    pretrain = pretrain_config(out, point, trial="L2",
                               trial_dir=f"{cfg.sweep_uri}/trials-x/L2")
    assert pretrain.model.init_path == uri
    prepare(pretrain)
    assert not (tmp_path / "driver").exists()

    # a second driver (another working folder) trains nothing: the storage has them
    def no_training(*a, **kw):
        raise AssertionError("trained again although the storage holds the weights")

    monkeypatch.setattr(text_init_module, "make_text_init", no_training)
    again: list[str] = []
    assert resolve_text_init(sweep_config(tmp_path / "driver2", tiny_world),
                             [TrialPoint(init="text")], say=again.append
                             ).model.text_init == f"bert:{uri}"
    assert again == [f"[text-init] reusing {uri}"]


def test_a_text_init_uri_that_names_nothing_is_a_preflight_problem(node_env):
    missing = f"bert:{STORAGE}/text-init/nothing/model.safetensors"
    assert "names no file or folder" in init_problem("text", "uniter-tiny", missing)


def test_a_local_storage_keeps_the_weights_beside_the_sweeps(tiny_world, tmp_path,
                                                            monkeypatch):
    monkeypatch.delenv("VLP_STORAGE", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://head:5000")
    monkeypatch.setattr(text_init_module, "make_text_init", functools.partial(
        text_init_module.make_text_init, steps=2, batch_size=8))
    cfg = sweep_config(tmp_path / "runs", tiny_world)
    out = resolve_text_init(cfg, [TrialPoint(init="text")], say=lambda line: None)
    tag = hashlib.sha1(cfg.world.encode()).hexdigest()[:8]
    path = tmp_path / "runs" / "text-init" / f"uniter-tiny-{tag}" / "model.safetensors"
    assert out.model.text_init == f"bert:{path}" and path.is_file()
