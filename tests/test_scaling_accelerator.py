"""scaling.accelerator_type pins a run to one GPU type: checked on load (Ray's names, only
with use_gpu) and handed to Ray Train's ScalingConfig, whose workers then ask for the
`accelerator_type:<GPU>` resource that cluster.yaml's node types declare. No Ray started."""

from __future__ import annotations

import pytest

from vlp.contract.config_loader import ConfigError
from vlp.platform.pretrain.experiment_config import ACCELERATOR_TYPES, load_experiment_config

BASE = {"run": {"name": "gpu"}, "model": {"family": "toy"},
        "data": {"sources": {"web": {"path": "/unused"}}}, "tasks": {"mlm": 1},
        "train": {"steps": 4}, "optimizer": {"warmup_steps": 1}, "mlflow": {"enabled": False}}


def test_the_names_are_rays():
    import ray.util.accelerators.accelerators as names

    rays = {v for k, v in vars(names).items() if k.startswith("NVIDIA_")}
    assert set(ACCELERATOR_TYPES) <= rays


def test_checked_on_load():
    with pytest.raises(ConfigError, match="unknown GPU type 'a100'"):
        load_experiment_config(data=BASE, overrides=["scaling.use_gpu=true",
                                                     "scaling.accelerator_type=a100"])
    with pytest.raises(ConfigError, match="accelerator_type: only used with use_gpu: true"):
        load_experiment_config(data=BASE, overrides=["scaling.accelerator_type=A100"])


def test_workers_ask_for_the_gpu_types_resource(monkeypatch, tmp_path):
    import vlp.platform.training.fail_once as fail_once
    from vlp.platform.pretrain.run import run_pretraining
    from vlp.testing.toy import ToyComponents

    seen = {}

    class Stop(Exception):
        pass

    def capture(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(fail_once, "FailOnceTorchTrainer", capture)
    cfg = load_experiment_config(data=BASE, overrides=[
        f"run.output_dir={tmp_path}", "scaling.use_gpu=true", "scaling.accelerator_type=A100"])
    with pytest.raises(Stop):
        run_pretraining(cfg, ToyComponents())
    scaling = seen["scaling_config"]
    assert scaling.accelerator_type == "A100"
    assert scaling._resources_per_worker_not_none["accelerator_type:A100"] > 0
