"""What the training loop needs from the model and the data pipeline, and nothing more.

The loop is written against these protocols; ``Components`` is the one object that builds
them (on the driver it is pickled into every Ray Train worker, so it must be picklable and
importable from an installed module). The real implementation wires ``vlp.models.create_model``
and the ``vlp.datasets`` pipeline; tests use ``vlp.testing.toy``.

State dicts (batch source, task sampler) are saved in checkpoints and loaded with
``torch.load(..., weights_only=True)``: keep them to plain containers (dict, list, tuple) of
int / float / str / bool / None and torch tensors — no numpy arrays, no custom classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from vlp.platform.training.loop_config import LoopConfig, LoopStage


@runtime_checkable
class PretrainModel(Protocol):
    """A ``torch.nn.Module`` called as ``model(batch, task=name)``. Returns a mapping of
    scalar losses with the total under ``"loss"`` and one ``"<name>_loss"`` per part (e.g.
    ``{"loss": l, "mlm_loss": l}``). Every rank must return the same keys for the same task."""

    def __call__(self, batch: Mapping[str, torch.Tensor], task: str) -> Mapping[str, torch.Tensor]:
        ...


@runtime_checkable
class BatchSource(Protocol):
    """This worker's batches. ``next(task)`` returns a batch prepared for ``task`` (masked for
    it) as ``dict[str, Tensor]`` with the keys of ``vlp/contract/batch_spec.py``, including the
    bookkeeping scalars ``num_examples`` and ``input_units``. An optional ``close()`` is called
    when the loop is done with it (end of a stage, end of training, failure). An optional
    ``load_resharded_state(states, saved_world)`` restores this worker's share from the
    states of the ``saved_world`` workers that wrote a checkpoint (a resume on another number
    of workers, ``checkpointing``); a source without it resumes on the same number only."""

    def next(self, task: str) -> dict[str, torch.Tensor]:
        ...

    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...


@runtime_checkable
class TaskSampler(Protocol):
    """Draws the task of each micro-batch from the mix ratios. Seeded identically on every
    rank, so that all ranks draw the same task (the loop checks this every micro-step)."""

    def next(self) -> str:
        ...

    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    seed: int               # the run seed (the same on every rank)


class Components(Protocol):
    """Builds the model, the batch source and the task sampler for a run."""

    def datasets(self, cfg: LoopConfig) -> dict[str, Any] | None:
        """Called on the driver: Ray Datasets to hand to the TorchTrainer (the worker side
        reads them with ``ray.train.get_dataset_shard``), or None."""
        ...

    def build_model(self, cfg: LoopConfig, tasks: list[str]) -> torch.nn.Module:
        """The model with heads for ``tasks`` (every task of every stage). Called after the
        loop has seeded torch with the run seed, identically on every rank."""
        ...

    def build_batch_source(self, cfg: LoopConfig, stage: LoopStage, stage_index: int,
                           worker: WorkerInfo) -> BatchSource:
        """This worker's batches for stage ``stage_index`` (the components know its data)."""
        ...

    def build_task_sampler(self, mix: dict[str, float], seed: int) -> TaskSampler:
        """A sampler over ``mix`` (task → ratio), seeded with ``seed``."""
        ...

    # Optional: ``after_training(cfg, model, worker) -> Any`` is called on every rank once
    # the last step is done (finetuning evaluates the benchmark there, sharded over the
    # ranks); rank 0's return value is the loop's ``return_value["after_training"]``.
    # Optional: ``dataset_config(cfg) -> ray.train.DataConfig`` is called on the driver: Ray
    # Train's ingest options for ``datasets`` (pretraining asks for ``preserve_order``).
