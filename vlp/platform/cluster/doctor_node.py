"""What `vlp doctor` checks on one node, run there (in ``doctor_rank.DoctorRank``) and
callable without Ray: the node's devices, the run storage written and read, the tracking
server reached, DeepSpeed's ops loaded. Each returns a dict of plain values; a failed check
carries ``error`` (one line) and ``fix`` (what to do), never raises.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from typing import Any

from vlp.platform.training.deepspeed_import import load_deepspeed


def devices(index: int = 0) -> dict[str, Any]:
    """This process's view of the node: host, the GPUs torch sees and the name of the one at
    ``index``."""
    import torch

    out: dict[str, Any] = {"host": socket.gethostname(), "torch": torch.__version__,
                           "gpus": 0, "gpu_name": None}
    if torch.cuda.is_available():
        out["gpus"] = torch.cuda.device_count()
        out["gpu_name"] = torch.cuda.get_device_name(index)
    from vlp.platform.cluster.instance_type import instance_type

    out["instance_type"] = instance_type()
    return out


def _fail(error: str, fix: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "error": " ".join(error.split()), "fix": fix, **extra}


def storage_write(root: str, key: str, nbytes: int) -> dict[str, Any]:
    """Write ``nbytes`` of random data as ``<root>/<key>`` and read it back: the rates (MB/s)
    and the data's sha256 (another node reads it next)."""
    from vlp.platform.cluster.run_storage import StorageError, open_location

    data = os.urandom(nbytes)
    digest = hashlib.sha256(data).hexdigest()
    try:
        storage = open_location(root)
        t0 = time.perf_counter()
        storage.write_bytes(data, key)
        t1 = time.perf_counter()
        back = storage.read_bytes(key)
        t2 = time.perf_counter()
    except (OSError, StorageError, ValueError) as e:
        return _fail(f"cannot write the run storage {root}: {type(e).__name__}: {e}",
                     "give this node write access to it (the instance profile for s3://, "
                     "AWS_ENDPOINT_URL for another endpoint; a mount every node shares for "
                     "a path), or set VLP_STORAGE / run.storage to storage it can write")
    if hashlib.sha256(back).hexdigest() != digest:
        return _fail(f"the run storage {root} returned other bytes than were written to "
                     f"{key} ({len(back)} of {nbytes})",
                     "check the storage's consistency (a cache or proxy in between)")
    return {"ok": True, "write_mb_s": nbytes / 1e6 / max(t1 - t0, 1e-9),
            "read_mb_s": nbytes / 1e6 / max(t2 - t1, 1e-9), "sha256": digest}


def storage_read(root: str, key: str, sha256: str, writer: str) -> dict[str, Any]:
    """Read ``<root>/<key>`` that node ``writer`` wrote: the same bytes, or the line that
    says this node does not share that storage."""
    from vlp.platform.cluster.run_storage import StorageError, open_location

    try:
        back = open_location(root).read_bytes(key)
    except (OSError, StorageError, ValueError) as e:
        return _fail(f"cannot read what node {writer} wrote to the run storage {root} "
                     f"({type(e).__name__}: {e})",
                     "the nodes do not share this storage: use s3:// (VLP_STORAGE) or a "
                     "mount every node has")
    if hashlib.sha256(back).hexdigest() != sha256:
        return _fail(f"what node {writer} wrote to {root}/{key} reads back differently here",
                     "the nodes do not share this storage: use s3:// or a shared mount")
    return {"ok": True}


def tracking(uri: str, timeout_s: float) -> dict[str, Any]:
    """The MLflow store answers from here (``mlflow_run.check_reachable``: /health of a
    server within ``timeout_s``)."""
    from vlp.contract.config_loader import redact
    from vlp.platform.tracking.mlflow_run import TrackingUnreachable, check_reachable

    t0 = time.perf_counter()
    try:
        check_reachable(uri, timeout_s)
    except (TrackingUnreachable, OSError, ValueError) as e:
        # its first sentence: the advice after it is for one machine, not a cluster
        return _fail(str(e).split(". ", 1)[0],
                     f"start the tracking server or open its port to this node; "
                             f"MLFLOW_TRACKING_URI (now {redact(uri)}) must name an address "
                             f"every node reaches")
    return {"ok": True, "ms": (time.perf_counter() - t0) * 1e3}


def deepspeed_ops() -> dict[str, Any]:
    """DeepSpeed imported here as a job's engines import it, and the accelerator it picks. No
    op is left to build: vlp's training JIT-builds none (DeepSpeed's CPU comm op serves only
    its inference and is not built, ``deepspeed_import.py``; CUDA has none)."""
    try:
        deepspeed = load_deepspeed()
        from deepspeed.accelerator import get_accelerator

        accel = get_accelerator()._name
    except Exception as e:  # noqa: BLE001 - DeepSpeed itself failing to import is the finding
        return _fail(f"DeepSpeed does not load: {type(e).__name__}: {e}",
                     "install the DeepSpeed of pyproject.toml into this node's environment")
    return {"ok": True, "accelerator": accel, "deepspeed": deepspeed.__version__,
            "ops": f"none to build ({accel})"}


__all__ = ["deepspeed_ops", "devices", "storage_read", "storage_write", "tracking"]
