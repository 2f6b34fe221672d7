"""Which failures Ray Train retries, and what a failed run leaves behind.

Ray Train 2.60 retries every worker-group failure up to ``FailureConfig.max_failures``
(``DefaultFailurePolicy``: any ``WorkerGroupError`` is retryable). That is right for a fault
(a node lost, a worker killed, a collective timed out) and wrong for an error that is a
property of the inputs: a checkpoint that does not fit the model, a config or data file a
worker cannot use. Such an error fails every attempt the same way, each after the full
worker start-up, each with its own traceback. So:

* the worker runs its set-up inside ``setup_phase``: an exception of a deterministic kind
  (``ValueError`` and its config / checkpoint / Arrow subclasses, ``LookupError``,
  ``TypeError``, a missing file, an import error, ...) becomes a one-line ``SetupError``;
  faults (``RuntimeError`` — which covers torch.distributed and CUDA errors —, ``OSError``
  other than a missing file, Ray's own errors) pass through unchanged and are retried;
* ``fail_once.FailOnceTorchTrainer`` hands the Train controller ``SetupErrorsFailOnce``,
  Ray's default policy except that a worker group failure carrying a ``SetupError`` is raised
  at once;
* the driver re-raises that ``SetupError`` (``setup_error_of``) instead of Ray's multi-line
  ``WorkerGroupError``, and ``remove_if_empty`` deletes a run folder that holds no checkpoint
  (only Ray's bookkeeping), so a run that never trained does not look like one.

This module imports no Ray at load time (workers and ``--check`` import it); the
controller-side classes are in ``fail_once.py``.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Iterator
from pathlib import PurePosixPath

# Exceptions that a retry on the same inputs raises again. Not here: RuntimeError (NCCL/gloo,
# CUDA, out of memory), OSError in general (network, storage), TimeoutError, Ray's errors.
DETERMINISTIC: tuple[type[BaseException], ...] = (
    ValueError, LookupError, TypeError, AttributeError, NameError, ImportError,
    NotImplementedError, AssertionError, FileNotFoundError, NotADirectoryError,
    IsADirectoryError, PermissionError, EOFError, pickle.UnpicklingError)

# what Ray Train writes into a run folder besides checkpoints (ray.train.v2._internal.constants
# VALIDATE_STORAGE_MARKER_FILENAME, CHECKPOINT_MANAGER_SNAPSHOT_FILENAME)
RAY_BOOKKEEPING = frozenset({".validate_storage_marker", "checkpoint_manager_snapshot.json"})


class SetupError(RuntimeError):
    """A worker's set-up failed for a reason that every retry would meet again (config,
    data, checkpoint). One line: ``<phase>: <Type>: <message>``."""


def one_line(text: str) -> str:
    return " ".join(text.split())


@contextlib.contextmanager
def setup_phase(what: str) -> Iterator[None]:
    """Run a worker's set-up: deterministic errors leave as ``SetupError`` naming ``what``
    (e.g. ``"rank 1 set-up"``) and the original error's type; faults pass unchanged."""
    try:
        yield
    except SetupError:
        raise
    except DETERMINISTIC as e:
        raise SetupError(f"{what}: {type(e).__name__}: {one_line(str(e))}") from e


def setup_error_of(error: BaseException) -> SetupError | None:
    """The ``SetupError`` a worker raised, if ``error`` (what ``fit`` raised or what the
    controller decides on) carries one."""
    from ray.train.v2.api.exceptions import WorkerGroupError

    if isinstance(error, SetupError):
        return error
    if isinstance(error, WorkerGroupError):
        for rank in sorted(error.worker_failures):
            cause = error.worker_failures[rank]
            if isinstance(cause, SetupError):
                return cause
    return None


def remove_if_empty(run_dir: str) -> bool:
    """Delete the Ray Train run folder ``run_dir`` (a path or a ``pyarrow.fs`` URI) when it
    holds nothing but Ray's bookkeeping: a failed first attempt must not leave a folder that
    looks like a run. A folder with anything else in it (a checkpoint, a resumed run's
    history) is kept. Returns whether it was deleted."""
    import pyarrow.fs as pafs

    from vlp.platform.cluster.run_storage import open_location

    storage = open_location(run_dir)        # the endpoint from the environment, as Ray's
    fs, path = storage.fs, storage.fs_path()
    if fs.get_file_info(path).type != pafs.FileType.Directory:
        return False
    names = {PurePosixPath(i.path).name
             for i in fs.get_file_info(pafs.FileSelector(path, recursive=False))}
    if names - RAY_BOOKKEEPING:
        return False
    fs.delete_dir(path)
    return True
