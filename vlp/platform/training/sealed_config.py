"""A Ray Train run's loop and ``train_loop_config``, sealed in Ray's object store: put once
by the driver, got by the workers, never unpickled by the run's controller.

Ray 2.60's Train V2 keeps ``train_loop_config`` in the run's ``TrainRunContext``, which its
controller actor (and the controller's callbacks) unpickle although they never read it. A vlp
config holds the job's components (model factory, batch source, tracking spec), whose modules
import transformers, the model families and the tasks: measured in a pretraining run's
controller, transformers with ``torch._dynamo`` and scipy.optimize, every ``vlp.models``
module, ~2 s of CPU per run (test_pretrain_train.py checks what the controller
imports). Sealed, the context holds an ``ObjectRef`` (as Ray seals the loop function itself,
``ObjectRefWrapper``); the workers get it through Ray's own serialization, and the ref lives
as long as the driver's trainer holds it: the whole ``fit``, retries included.

This module imports nothing but Ray: it is what the controller imports for the entry point.
"""

from __future__ import annotations

from typing import Any, Callable

SEALED = "vlp_sealed"


def seal(train_loop: Callable[[dict], Any], config: dict | None
         ) -> tuple[Callable[[dict], Any], dict]:
    """``(run_sealed, {SEALED: ref})`` to give ``TorchTrainer`` instead of the pair."""
    import ray

    return run_sealed, {SEALED: ray.put((train_loop, config))}


def run_sealed(config: dict) -> Any:
    """The worker's entry point: the loop and its config, got, and run as Ray Train would
    run them (a loop without a parameter is called without the config)."""
    import inspect

    import ray

    train_loop, inner = ray.get(config[SEALED])
    if not inspect.signature(train_loop).parameters:
        return train_loop()
    return train_loop(inner if inner is not None else {})
