"""What reaches the terminal from Ray's processes. Quiet (the ``vlp`` commands' default):
vlp's own lines (``[sweep] …``, ``[vlp pretrain] …``), printed without Ray's
``(RayTrainWorker pid=…)`` prefix, and the raylet's warnings (a worker killed for memory; not
its note that many worker processes were started, which every sweep sets off);
everything else the workers, Train controllers and Tune trials print (Ray Train's INFO logs
such as ``Reporting training result …``, DeepSpeed's logs, tracebacks) goes to a log file in
the run folder (the autoscaler's status table, which Ray's own printer drops, is dropped);
the driver's own INFO chatter from MLflow and Optuna is turned down to warnings. Verbose
(``--verbose``): everything prints as it always does.

    configure(quiet=not args.verbose)      # a command, before it starts anything
    ensure_ray(...)                        # ray_session calls apply() after ray.init
    log_to(run_dir / RAY_LOG)              # where the rest goes, once the run folder is known

Ray's driver prints worker output through one handler ("ray_print_logs") of a dispatcher
that every line of every worker passes through; quiet mode puts a router in its place. The
dispatcher is internal to Ray 2.60 (``ray._private.ray_logging``): where it is missing the
router is not installed and Ray prints as usual.
"""

from __future__ import annotations

import collections
import threading
from pathlib import Path
from typing import Any

RAY_LOG = "ray-output.log"
VLP_PREFIXES = ("[sweep]", "[vlp ", "[demo")
# raylet warnings that vlp's design sets off and a user cannot act on (every stage is a fresh
# Ray Train run, so a sweep starts many worker processes): to the log file only
RAYLET_NOISE = ("PYTHON worker processes have been started",)
_RAY_HANDLER, _OUR_HANDLER = "ray_print_logs", "vlp_console"
_MAX_BUFFERED = 20_000            # lines kept before a log file is named


class RayOutputRouter:
    """The dispatcher's handler: every line to the log file (with Ray's prefix), vlp's lines
    and the raylet's to the terminal (without it)."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._pending: list[str] = []
        self._lock = threading.Lock()
        # a Train worker's print reaches the driver twice (Ray Train's print patch logs it
        # through the root logger, whose console handler echoes it on the other stream):
        # the terminal shows a process's line once
        self._shown: dict[Any, collections.deque] = {}

    def __call__(self, data: dict[str, Any]) -> None:
        import sys

        pid = data.get("pid")
        who = data.get("actor_name") or data.get("task_name") or ""
        prefix = f"({who + ' ' if who else ''}pid={pid})"
        shown = []
        for line in data.get("lines", []):
            text = str(line)
            if pid == "autoscaler" and ":event_summary:" not in text:
                continue       # its status table every few seconds: Ray's printer drops it too
            if text.lstrip().startswith(VLP_PREFIXES) or (
                    pid == "raylet" and not any(n in text for n in RAYLET_NOISE)):
                recent = self._shown.setdefault(pid, collections.deque(maxlen=16))
                if text not in recent:
                    recent.append(text)
                    shown.append(text)
            self._write(f"{prefix} {text}")
        for text in shown:
            print(text, file=sys.stdout, flush=True)

    def _write(self, line: str) -> None:
        with self._lock:
            if self.path is None:
                if len(self._pending) < _MAX_BUFFERED:
                    self._pending.append(line)
                return
            with open(self.path, "a") as f:
                f.write(line + "\n")

    def set_path(self, path: Path) -> None:
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.writelines(line + "\n" for line in self._pending)
            self._pending = []
            self.path = path


_state: dict[str, Any] = {"quiet": False, "router": None, "path": None}


def configure(*, quiet: bool) -> None:
    """Quiet or verbose for this process (the ``vlp`` commands call it from ``--verbose``)."""
    import logging
    import os

    _state["quiet"] = quiet
    if quiet:
        # Tune's default reporter prints its experiment box and a results/TensorBoard hint
        # even at verbose=0; its legacy reporter at verbose=0 prints nothing (read when the
        # Tuner runs, in this process only)
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        # "Creating initial MLflow database tables", "A new study created in memory", ...
        import mlflow  # noqa: F401  (it sets its loggers' levels on import: import it first)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)   # its logger is set up lazily
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)


def apply() -> bool:
    """After ``ray.init`` (``ray_session.ensure_ray``): route worker output when quiet.
    True when the router is in place."""
    if not _state["quiet"]:
        return False
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    names = [name for name, _ in getattr(dispatcher, "handlers", [])]
    if _OUR_HANDLER in names:
        return True
    if _RAY_HANDLER not in names:         # log_to_driver=False, or another Ray: leave it be
        return False
    router = _state["router"] or RayOutputRouter()
    _state["router"] = router
    if _state["path"] is not None and router.path is None:
        router.set_path(_state["path"])
    dispatcher.remove_handler(_RAY_HANDLER)
    dispatcher.add_handler(_OUR_HANDLER, router)
    return True


def log_folder(storage: str, output_dir: str) -> Path:
    """Where a job's Ray log goes: its run storage when that is a local folder; for a URI
    (``s3://…``, a multi-node job) a folder under the node's temp dir — never ``output_dir``
    resolved against the job's working dir, which under ``ray job submit`` is Ray's
    package folder and must hold no run files."""
    import tempfile

    from vlp.platform.cluster.run_storage import is_uri, storage_root

    root = storage_root(storage, output_dir)
    if is_uri(root):
        return Path(tempfile.gettempdir()) / "vlp-ray-logs"
    local = root[len("file://"):] if root.startswith("file://") else root
    return Path(local).expanduser().resolve()


def log_to(path: str | Path) -> Path | None:
    """Send the routed output to ``path`` from now on (with what came before it; before Ray
    starts: once it does); the path, or None when nothing is routed (verbose, or Ray was
    started by someone else, e.g. a ``ray job`` entry script, and prints as usual)."""
    import ray

    if not _state["quiet"]:
        return None
    if _state["router"] is None and ray.is_initialized():
        return None
    _state["path"] = Path(path)
    if _state["router"] is not None:
        _state["router"].set_path(Path(path))
    return Path(path)
