"""``PretrainComponents``: the training loop's ``Components`` for real pretraining.

    setup = pretrain_data.prepare(cfg)            # driver: every check, one plan per stage
    components = PretrainComponents(setup)
    run_pretraining(cfg, components)

Driver side, ``datasets`` builds one Ray Dataset per stage (``stage0``, ``stage1``, ...).
Worker side, a stage's batch source is ``PretrainBatches`` over that stage's
``ray.train.get_dataset_shard`` (Ray Data's streaming split: disjoint data per worker), the
task sampler is the pipeline's ``TaskSampler``, and the model is ``create_model`` with the
heads of every stage's tasks.

Exact resume and deterministic multi-worker streams: the datasets read the files in the same
(seeded) order every epoch, with Ray Data's ``preserve_order``, so each rank receives the same
blocks in the same order in every execution of the dataset — also in a restarted run, where
Ray numbers executions from 0 again. Per-epoch randomness is worker-side (window shuffles
and source resampling seeded by epoch, masking by the batch's place in its epoch). Ranks end
each epoch at the same step (an all-reduce before every batch; the ranks with batches left
drop them, see ``PretrainBatches``), so no rank ever waits at the next epoch's barrier while
another waits for it in a collective. Under ``data.stream: global`` the stage's dataset is not
split: every rank reads all of it and trains every W-th batch (``batch_stream``), with no
epoch barrier and a position that moves to another number of workers. A checkpoint records (epoch, batches served); a
restored worker re-reads that epoch and passes over the served batches without collating
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vlp.datasets.batching.pretrain_batches import PretrainBatches
from vlp.datasets.batching.task_sampler import TaskSampler
from vlp.models import create_model
from vlp.models.heads import extend_for
from vlp.platform.pretrain.data import PretrainSetup
from vlp.platform.pretrain.init_weights_check import cnn_init_file, model_kwargs
from vlp.platform.training.loop_config import LoopConfig, LoopStage
from vlp.platform.training.protocols import WorkerInfo


class AnyRank:
    """``epoch_sync`` for ``PretrainBatches``: whether any rank's epoch is exhausted (one
    all-reduce of a flag). It runs on the loop's prefetch thread, concurrently with the main
    thread's collectives, so it uses a gloo group of its own (collectives of one group are
    ordered; two threads sharing one group would interleave differently on each rank), on
    host memory (no device sync). Build it on every rank at the same point: creating the
    group is itself a collective."""

    _groups: dict[int, Any] = {}   # per default group: shared by every stage's source

    def __init__(self, device: torch.device | None = None):
        import torch.distributed as dist

        key = id(dist.group.WORLD)
        if key not in AnyRank._groups:
            AnyRank._groups[key] = dist.new_group(backend="gloo")
        self.group = AnyRank._groups[key]

    def __call__(self, exhausted: bool) -> bool:
        import torch.distributed as dist

        flag = torch.tensor([1 if exhausted else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())


@dataclass
class PretrainComponents:
    setup: PretrainSetup

    # ---- driver ---------------------------------------------------------------------------

    def datasets(self, cfg: LoopConfig) -> dict[str, Any]:
        from vlp.datasets.stream.pipeline import build_dataset

        self._check_stages(cfg)
        return {s.dataset: build_dataset(s.plan, reshuffle_files=False)
                for s in self.setup.stages}

    def dataset_config(self, cfg: LoopConfig) -> Any:
        """Ray Train's ingest options: ``preserve_order`` makes the streaming split hand
        each rank the same blocks in every execution (see the module docstring); a stage
        under ``data.stream: global`` is not split: every rank reads all of it."""
        import ray.train
        from ray.data import ExecutionOptions

        split = [s.dataset for s in self.setup.stages if s.plan.config.stream != "global"]
        return ray.train.DataConfig(datasets_to_split=split,
                                    execution_options=ExecutionOptions(preserve_order=True))

    def _check_stages(self, cfg: LoopConfig) -> None:
        names = [s.name for s in cfg.stages]
        if names != [s.name for s in self.setup.stages]:
            raise ValueError(f"these components were prepared for stages "
                             f"{[s.name for s in self.setup.stages]}, the config has {names}: "
                             f"call pretrain_data.prepare(cfg) for this config")

    # ---- workers --------------------------------------------------------------------------

    def build_model(self, cfg: LoopConfig, tasks: list[str]) -> torch.nn.Module:
        s = self.setup
        if set(tasks) != set(s.tasks):
            raise ValueError(f"the loop asks for heads {tasks}, the setup has {list(s.tasks)}")
        # the same arguments the driver's init_weights_check used
        model = create_model(**model_kwargs(s.model, s)).model
        if s.model.cnn_init:   # SOHO's ImageNet start (checked on the driver in prepare)
            from vlp.models.vision.cnn_weights import load_cnn_weights

            # a URI: read into this node's cache, as model.init_path is
            load_cnn_weights(model.backbone.visual.resnet, cnn_init_file(s.model))
        if s.model.token_types:   # after init: the new rows copy the pretrained text row
            extend_for(model.backbone, s.model.token_types)
        return model

    def build_batch_source(self, cfg: LoopConfig, stage: LoopStage, stage_index: int,
                           worker: WorkerInfo) -> PretrainBatches:
        import ray.train

        from vlp.datasets.stream.pipeline import shard_blocks

        data = self.setup.stages[stage_index]
        shard = ray.train.get_dataset_shard(data.dataset)
        if data.plan.config.stream == "global":   # the whole dataset (not split): no sync
            return PretrainBatches(data.plan, shard_blocks(shard, data.plan), rank=worker.rank,
                                   world_size=worker.world_size, global_order=True)
        sync = AnyRank(worker.device) if worker.world_size > 1 else None
        return PretrainBatches(data.plan, shard_blocks(shard, data.plan), rank=worker.rank,
                               epoch_sync=sync, world_size=worker.world_size)

    def build_task_sampler(self, mix: dict[str, float], seed: int) -> TaskSampler:
        return TaskSampler(mix, seed)
