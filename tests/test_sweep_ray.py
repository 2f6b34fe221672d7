"""Integration: a tiny sweep on real Ray Tune + Ray Train + MLflow, interrupted as its first
trial starts (SIGUSR1, as Ctrl-C would): the sweep's folder holds its config, and running the
same sweep.name with another value is refused before any trial starts.

A sweep run to its end and read back from MLflow (trials, child runs, the leaderboard
artifacts and `vlp leaderboard`), interrupted and restored from S3 on the way, is
tests/test_multinode_cluster.py; a restore that resumes a trial after
its first stage is test_sweep_asha.py, and one that reruns only the unfinished replicate,
test_sweep_replicates.py. (A repeated point is no trial: tests/test_sweep_tune.py; a bad text
init is refused before any trial: tests/test_sweep_preflight.py.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import ray.tune

from vlp.platform.sweep import load_sweep_config, run_sweep

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).resolve().parents[1] / "jobs" / "configs" / "sweep-tiny.yaml"


class InterruptAtFirstTrial(ray.tune.Callback):
    """Sends SIGUSR1 (Tune's stop signal) once, when the first trial starts."""

    def __init__(self):
        self.sent = False

    def on_trial_start(self, iteration, trials, trial, **info):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGUSR1)


@pytest.fixture(scope="module")
def overrides(tiny_world, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    return [f"world={tiny_world}", f"sweep.output_dir={out}", "sweep.num_samples=2",
            "sweep.include=[none,paper-best]", "sweep.max_concurrent=1", "space.init=[random]",
            "finetune.benchmarks=[vqa]", "sweep.scheduler=fifo"]


@pytest.fixture(scope="module")
def sweep(ray_local, overrides):
    cfg = load_sweep_config(CONFIG, overrides)
    first = run_sweep(cfg, callbacks=[InterruptAtFirstTrial()])
    assert first.interrupted
    return cfg.resolved()


def test_a_changed_config_is_refused_on_restore(sweep, overrides):
    """The sweep's folder holds its config: running the same sweep.name with another value
    fails before any trial starts, naming the key and the folder."""
    from vlp.contract.config_loader import ConfigError

    cfg = sweep
    with pytest.raises(ConfigError, match="sweep.num_samples") as e:
        run_sweep(load_sweep_config(CONFIG, overrides + ["sweep.num_samples=5"]))
    assert f"differs from the sweep already in {cfg.sweep_dir}" in str(e.value)
