"""Restoring a sweep from its folder, without Ray: the first run writes the config and an
instance id; a re-run of the same config resumes that instance; a changed config is refused
naming the key (only the resumable keys may change). The whole interrupted-and-resumed sweep
on real Ray Tune is test_sweep_ray.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlp.contract.config_loader import ConfigError
from vlp.platform.sweep import load_sweep_config
from vlp.platform.sweep.run import TUNE_DIR, _check_resume

CONFIG = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "sweep-tiny.yaml"


def sweep_config(tmp_path, *changes):
    return load_sweep_config(CONFIG, [f"sweep.output_dir={tmp_path}", *changes]).resolved()


def test_a_restored_sweep_keeps_its_instance_and_refuses_a_changed_config(tmp_path):
    cfg = sweep_config(tmp_path)
    resuming, instance = _check_resume(cfg, cfg.sweep_dir)
    assert not resuming and len(instance) == 8
    (cfg.sweep_dir / TUNE_DIR).mkdir()
    (cfg.sweep_dir / TUNE_DIR / "tuner.pkl").write_bytes(b"")      # what Tune's restore needs
    assert _check_resume(cfg, cfg.sweep_dir) == (True, instance)
    # the resumable keys may change
    relaxed = sweep_config(tmp_path, "sweep.max_concurrent=3", "sweep.trial_retries=2")
    assert _check_resume(relaxed, relaxed.sweep_dir) == (True, instance)
    for change, key in (("sweep.num_samples=7", "sweep.num_samples"),
                        ("pretrain.train.steps=5", "pretrain.train.steps")):
        changed = sweep_config(tmp_path, change)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
            _check_resume(changed, changed.sweep_dir)
        assert f"differs from the sweep already in {cfg.sweep_dir}" in str(e.value)
    # a Tune folder without the instance file cannot be resumed: refused, not restarted
    (cfg.sweep_dir / "instance").unlink()
    with pytest.raises(ConfigError, match="cannot be resumed"):
        _check_resume(cfg, cfg.sweep_dir)
