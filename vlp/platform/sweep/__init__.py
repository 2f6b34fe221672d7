"""Sweeps over pretraining configurations: Ray Tune + Optuna (TPE) + ASHA over a search space
of task mixes, masking, data and initialisation, or a replay of a paper's ablation grid
(UNITER Table 3); every trial pretrains, finetunes each benchmark and reports Meta-Sum.

    from vlp.platform.sweep import load_sweep_config, run_sweep
    result = run_sweep(load_sweep_config("jobs/configs/sweep-demo.yaml"))
    print(result.leaderboard.markdown())

Files: ``point`` (a point of the space and its labels), ``space`` (the space, its checks
against the model registry, the Optuna sampler), ``replays`` (named grids: table3),
``sweep_config`` (the YAML config), ``trial_configs`` (point → pretraining / finetune configs),
``preflight`` (every check before the first trial), ``trial`` (the Tune trainable),
``tracking`` (MLflow parent and trial runs), ``callbacks`` (progress, run status,
leaderboard refresh), ``asha`` (ASHA whose rungs survive a restore), ``run`` (Tuner set-up
and restore).
"""

from vlp.platform.sweep.sweep_config import SweepConfig, load_sweep_config
from vlp.platform.sweep.point import TrialPoint
from vlp.platform.sweep.replays import REPLAYS, replay_lines
from vlp.platform.sweep.run import SweepResult, run_sweep
from vlp.platform.sweep.space import SearchSpace, check_space

__all__ = ["SweepConfig", "load_sweep_config", "TrialPoint", "REPLAYS", "replay_lines",
           "SweepResult", "run_sweep", "SearchSpace", "check_space"]
