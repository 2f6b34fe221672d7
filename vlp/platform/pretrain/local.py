"""A pretraining job in this process, without Ray (``vlp pretrain --local``, the GPU check):
the same checks, summary, loop, engine and checkpoints as a Ray job, with the local runner
(``vlp.platform.training.local_runner``) in place of Ray Train and the local batch stream
(``local_batches``: the same transform and batcher as Ray Data's, read with pyarrow) in place
of a Ray Data shard. One worker; runs go to the local run folder OUTPUT_DIR/NAME, where a
re-run resumes from the last checkpoint."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlp.platform.cluster import run_storage
from vlp.platform.pretrain.components import PretrainComponents
from vlp.platform.pretrain.data import prepare
from vlp.platform.pretrain.experiment_config import ExperimentConfig
from vlp.platform.pretrain.run import PretrainResult, loop_config, preflight, tracking_spec
from vlp.platform.training.local_runner import METRICS_FILE, run_local
from vlp.platform.training.loop_config import LoopStage
from vlp.platform.training.protocols import WorkerInfo


class LocalPretrainComponents(PretrainComponents):
    """``PretrainComponents`` with the local batch stream: no Ray Dataset to build or shard."""

    def datasets(self, cfg: Any) -> dict[str, Any]:
        return {}

    def build_batch_source(self, cfg: Any, stage: LoopStage, stage_index: int,
                           worker: WorkerInfo) -> Any:
        from vlp.datasets.stream.local_stream import local_batches

        return local_batches(self.setup.stages[stage_index].plan, rank=worker.rank,
                             world_size=worker.world_size)


def one_worker(cfg: ExperimentConfig) -> ExperimentConfig:
    return cfg.model_copy(update=dict(scaling=cfg.scaling.model_copy(update=dict(
        num_workers=1))))


def pretrain_local(cfg: ExperimentConfig, *, say: Callable[[str], None] = print
                   ) -> PretrainResult:
    """Run (or resume) ``cfg`` in this process on one worker; ``cfg`` as loaded (it is
    resolved and checked here, as ``job.pretrain`` does)."""
    from vlp.platform.pretrain.job import resolved, summary

    if cfg.scaling.num_workers != 1:
        say(f"[vlp pretrain] --local: one process, so scaling.num_workers "
            f"{cfg.scaling.num_workers} → 1")
        cfg = one_worker(cfg)
    cfg = resolved(cfg)
    storage = run_storage.open_location(cfg.run.storage)
    if not storage.is_local:
        raise ValueError(f"--local writes to a local folder; run storage is {storage.root} "
                         f"(set run.storage to a folder, or unset VLP_STORAGE)")
    setup = prepare(cfg)
    preflight(cfg)
    for line in summary(cfg, setup):
        say(f"[vlp pretrain] {line}")
    run_dir = Path(storage.root) / cfg.run.name
    tracking = tracking_spec(cfg)
    value = run_local(loop_config(cfg), LocalPretrainComponents(setup), tracking, run_dir)
    reports = run_dir / METRICS_FILE
    last = json.loads(reports.read_text().splitlines()[-1]) if reports.exists() else {}
    return PretrainResult(
        run_dir=str(run_dir), checkpoint_path=value.get("checkpoint_path"),
        final_step=int(value.get("final_step", 0)),
        completed=bool(value.get("completed", False)),
        history=list(value.get("history", [])), mlflow_run_id=value.get("mlflow_run_id"),
        tracking_uri=tracking["tracking_uri"] if tracking["enabled"] else None,
        metrics=last, return_value=value)
