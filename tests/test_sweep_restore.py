"""Restoring a sweep from its folder, without Ray: the first run writes the config and an
instance id; a re-run of the same config resumes that instance; a changed config is refused
naming the key (only the resumable keys may change). The whole interrupted-and-resumed sweep
on real Ray Tune, restored from S3, is test_multinode_cluster.py."""

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
    resuming, instance = _check_resume(cfg, cfg.sweep_storage())
    assert not resuming and len(instance) == 8
    (cfg.sweep_dir / TUNE_DIR).mkdir()
    (cfg.sweep_dir / TUNE_DIR / "tuner.pkl").write_bytes(b"")      # what Tune's restore needs
    assert _check_resume(cfg, cfg.sweep_storage()) == (True, instance)
    # the resumable keys may change
    relaxed = sweep_config(tmp_path, "sweep.max_concurrent=3", "sweep.trial_retries=2")
    assert _check_resume(relaxed, relaxed.sweep_storage()) == (True, instance)
    for change, key in (("sweep.num_samples=7", "sweep.num_samples"),
                        ("pretrain.train.steps=5", "pretrain.train.steps")):
        changed = sweep_config(tmp_path, change)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
            _check_resume(changed, changed.sweep_storage())
        assert f"differs from the sweep already in {cfg.sweep_dir}" in str(e.value)
    # a Tune folder without the instance file cannot be resumed: refused, not restarted
    (cfg.sweep_dir / "instance").unlink()
    with pytest.raises(ConfigError, match="cannot be resumed"):
        _check_resume(cfg, cfg.sweep_storage())


def test_a_sweep_in_s3_is_found_again_from_another_working_folder(s3_env, tmp_path,
                                                                   monkeypatch):
    """sweep.storage (here $VLP_STORAGE) a URI: the config, instance id and Tune state live in
    the bucket, nothing in the local folder; a resubmitted job (a new working folder, so
    another output_dir) resumes the same instance; the exhausted-space marker is read there."""
    from vlp.platform.sweep.distinct_search import space_exhausted
    from vlp.platform.sweep.run import EXHAUSTED_FILE, tune_location

    s3_env.create_bucket("sweeps-restore")
    monkeypatch.setenv("VLP_STORAGE", "s3://sweeps-restore/vlp")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://head:5000")   # as on a cluster
    cfg = sweep_config(tmp_path / "pkg1")
    assert cfg.sweep.storage == "s3://sweeps-restore/vlp"
    assert cfg.sweep_uri == f"s3://sweeps-restore/vlp/{cfg.sweep.name}"
    storage = cfg.sweep_storage()
    resuming, instance = _check_resume(cfg, storage)
    assert not resuming and storage.read_text("instance").strip() == instance
    assert not (tmp_path / "pkg1").exists()
    path, fs = tune_location(storage)
    assert path == f"sweeps-restore/vlp/{cfg.sweep.name}/{TUNE_DIR}" and fs is storage.fs
    storage.write_text("", TUNE_DIR, "tuner.pkl")          # what Tune's restore needs
    again = sweep_config(tmp_path / "pkg2")
    assert _check_resume(again, again.sweep_storage()) == (True, instance)
    changed = sweep_config(tmp_path / "pkg2", "sweep.num_samples=7")
    with pytest.raises(ConfigError,
                       match=r"differs from the sweep already in s3://sweeps-restore/vlp"):
        _check_resume(changed, changed.sweep_storage())
    assert space_exhausted(storage.uri(EXHAUSTED_FILE)) == ""
    storage.write_text("2 distinct points\n", EXHAUSTED_FILE)
    assert space_exhausted(storage.uri(EXHAUSTED_FILE)) == "2 distinct points"
