"""Which MLflow store a command uses, the same rule for every command (pretrain, finetune,
evaluate, sweep, leaderboard, ui): the config's ``mlflow.tracking_uri`` (or ``--tracking-uri``),
else ``$MLFLOW_TRACKING_URI``, else the embedded SQLite store under the local runs folder.

A file store (``sqlite:``, ``file:``, a bare path) lives on one node's disk: attached to a
cluster of more than one node, the training loop's rank 0 may run on another node (and the
node may scale down), so such a store is refused before anything starts.
"""

from __future__ import annotations

import os
import urllib.parse
from pathlib import Path

from vlp.contract.config_loader import redact
from vlp.platform.cluster.run_storage import alive_nodes
from vlp.platform.tracking.mlflow_run import TrackingUnreachable, embedded_tracking_uri

TRACKING_ENV = "MLFLOW_TRACKING_URI"


def choose_tracking_uri(configured: str, local_root: str | Path) -> str:
    return configured or os.environ.get(TRACKING_ENV, "") or embedded_tracking_uri(local_root)


def is_file_store(uri: str) -> bool:
    return urllib.parse.urlparse(uri).scheme.lower() in ("", "file", "sqlite")


def check_tracking_shared(uri: str, nodes: int | None = None, why: str = "") -> None:
    """Raise ``TrackingUnreachable`` for a file store on a job spanning ``nodes`` > 1 nodes
    (``why`` says why; without ``nodes``, the live nodes are counted)."""
    if not is_file_store(uri):
        return
    nodes = alive_nodes() if nodes is None else nodes
    if nodes > 1:
        raise TrackingUnreachable(
            f"MLflow store {redact(uri)} is a file on one node, and this job spans nodes "
            f"({why or f'a {nodes}-node cluster'}): set MLFLOW_TRACKING_URI=http://<head>:5000 "
            f"(a tracking server every node reaches; cluster.yaml exports it on every node) "
            f"or mlflow.tracking_uri")
