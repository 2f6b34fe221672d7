"""``FailOnceTorchTrainer``: a ``TorchTrainer`` whose Train controller raises a worker's
``SetupError`` at once instead of retrying it ``max_failures`` times (see ``failures.py``).

Ray 2.60 offers no public hook for the failure policy: ``TorchTrainer.fit`` builds
``DefaultFailurePolicy(failure_config)`` and passes it to ``_initialize_and_run_controller
(**kwargs)`` as ``failure_policy`` (ray/train/v2/api/data_parallel_trainer.py); that keyword
is the seam used here. tests/test_pretrain_fail_once.py fails if it moves.

The loop and its config travel sealed (``sealed_config.py``): the controller does not
unpickle the job's components.
"""

from __future__ import annotations

import logging
from typing import Any

from ray.train.torch import TorchTrainer
from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision

from vlp.platform.training.failures import setup_error_of
from vlp.platform.training.sealed_config import seal

log = logging.getLogger(__name__)


class SetupErrorsFailOnce(DefaultFailurePolicy):
    """Ray's default policy, except that a set-up error is raised at once, not retried
    (runs in the Train controller actor)."""

    def make_decision(self, training_failed_error: Any) -> FailureDecision:
        cause = setup_error_of(training_failed_error)
        if cause is not None:
            log.warning("[vlp] not retried: a set-up error fails every attempt alike: %s", cause)
            return FailureDecision.RAISE
        return super().make_decision(training_failed_error)


class FailOnceTorchTrainer(TorchTrainer):
    """``TorchTrainer`` whose controller runs ``SetupErrorsFailOnce``, with the loop and its
    config sealed."""

    def __init__(self, train_loop_per_worker: Any, *, train_loop_config: dict | None = None,
                 **kwargs: Any):
        loop, config = seal(train_loop_per_worker, train_loop_config)
        super().__init__(loop, train_loop_config=config, **kwargs)

    def _initialize_and_run_controller(self, **controller_init_kwargs):
        controller_init_kwargs["failure_policy"] = SetupErrorsFailOnce(
            self.run_config.failure_config)
        return super()._initialize_and_run_controller(**controller_init_kwargs)
