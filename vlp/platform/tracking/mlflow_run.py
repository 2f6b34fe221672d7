"""MLflow tracking: the embedded default store, a reachability check, and runs addressed by id.

Everything goes through ``MlflowClient`` with an explicit run id rather than MLflow's fluent
global "active run": Ray workers, Tune trials and threads then never log into each other's
runs. Only one process per job writes a run (rank 0 of the training loop; the driver of a
sweep for the parent run).

Nested runs (finetune under pretrain, trials under a sweep)::

    parent = MlflowRun.open(uri, "vlp-sweep", run_name="mix-search")
    child = MlflowRun.open(uri, "vlp-sweep", run_name="trial-3",
                           parent_run_id=parent.run_id)          # or parent.child("trial-3")

Pass ``parent.run_id`` (a string) to whatever process opens the child.
"""

from __future__ import annotations

import hashlib
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vlp.contract.config_loader import redact

RUN_KEY_TAG = "vlp.run_key"            # deterministic per job: find the run again on restart
PARENT_TAG = "mlflow.parentRunId"      # what the MLflow UI nests runs by
_MAX_BATCH_METRICS = 1000              # MLflow's log_batch limits
_MAX_BATCH_PARAMS = 100


class TrackingUnreachable(RuntimeError):
    """The tracking server / store cannot be used; raised before any training starts."""


# ---- where runs go --------------------------------------------------------------------------

def embedded_tracking_uri(runs_root: str | Path) -> str:
    """``sqlite:////abs/runs/mlflow.db``: absolute, because Ray workers and job drivers run
    in other folders than the one the user started from."""
    return f"sqlite:///{Path(runs_root).expanduser().resolve() / 'mlflow.db'}"


def embedded_artifact_location(runs_root: str | Path) -> str:
    return (Path(runs_root).expanduser().resolve() / "mlartifacts").as_uri()


def run_key(*parts: str) -> str:
    """A stable id for one job (e.g. from storage path + run name), stored as a run tag."""
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:20]


def check_reachable(uri: str, timeout_s: float = 3.0) -> None:
    """Raise ``TrackingUnreachable`` naming the (password-free) URI if it cannot be used.

    http(s): the server's ``/health`` must answer within ``timeout_s``; sqlite: the database
    path must be absolute and its folder creatable; other databases: a TCP connect to
    host:port. Cheap enough to run before every job.
    """
    shown = redact(uri)
    parsed = urllib.parse.urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme in ("http", "https"):
        # credentials never go on the wire in a URL; /health needs none
        netloc = parsed.hostname or ""
        if parsed.port:
            netloc += f":{parsed.port}"
        health = urllib.parse.urlunparse((scheme, netloc, parsed.path.rstrip("/") + "/health",
                                          "", "", ""))
        try:
            with urllib.request.urlopen(health, timeout=timeout_s) as resp:
                if resp.status != 200:
                    raise TrackingUnreachable(
                        f"MLflow tracking server {shown} answered /health with HTTP {resp.status}")
        except urllib.error.HTTPError as e:
            raise TrackingUnreachable(
                f"MLflow tracking server {shown} answered /health with HTTP {e.code}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            raise TrackingUnreachable(
                f"MLflow tracking server {shown} is unreachable ({reason}; waited "
                f"{timeout_s:g} s). Start it, or leave mlflow.tracking_uri empty for the "
                f"embedded SQLite store") from None
    elif scheme == "sqlite":
        path = uri[len("sqlite:///"):]
        if not path.startswith("/"):
            raise TrackingUnreachable(
                f"MLflow tracking URI {shown} is relative: use sqlite:////absolute/path.db "
                f"(Ray workers run in other folders)")
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TrackingUnreachable(f"MLflow store {shown}: cannot create its folder: {e}") \
                from None
    elif scheme in ("postgresql", "mysql", "mssql") or "+" in scheme:
        host, port = parsed.hostname, parsed.port or {"postgresql": 5432, "mysql": 3306,
                                                      "mssql": 1433}.get(scheme.split("+")[0])
        if host and port:
            try:
                socket.create_connection((host, port), timeout=timeout_s).close()
            except OSError as e:
                raise TrackingUnreachable(f"MLflow store {shown} is unreachable ({e})") from None
    elif scheme in ("", "file"):
        raise TrackingUnreachable(
            f"MLflow tracking URI {shown!r}: file stores are deprecated in MLflow 3; use "
            f"sqlite:////absolute/path.db or an http(s) server")
    # databricks, etc.: no cheap check


# ---- runs -----------------------------------------------------------------------------------

def run_id_by_key(client: Any, experiment_ids: Sequence[str], key: str) -> str | None:
    """The id of the run tagged ``key`` (``RUN_KEY_TAG``) in these experiments, or None."""
    found = client.search_runs(list(experiment_ids),
                               filter_string=f"tags.`{RUN_KEY_TAG}` = '{key}'", max_results=1)
    return found[0].info.run_id if found else None


class MlflowRun:
    """One MLflow run, written by one process."""

    def __init__(self, client: Any, run_id: str, experiment_id: str, tracking_uri: str):
        self.client = client
        self.run_id = run_id
        self.experiment_id = experiment_id
        self.tracking_uri = tracking_uri

    @classmethod
    def open(cls, tracking_uri: str, experiment: str, *, run_name: str,
             run_id: str | None = None, key: str | None = None,
             parent_run_id: str | None = None, tags: Mapping[str, str] | None = None,
             artifact_location: str | None = None) -> MlflowRun:
        """Attach to ``run_id`` if given; else to the run tagged with ``key`` if one exists
        (a restarted job); else create a run. ``parent_run_id`` nests it."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri)
        exp_id = _experiment_id(client, experiment, artifact_location)
        if run_id is None and key is not None:
            run_id = run_id_by_key(client, [exp_id], key)
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            return cls(client, run_id, exp_id, tracking_uri)
        all_tags = dict(tags or {})
        if key is not None:
            all_tags[RUN_KEY_TAG] = key
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
        return cls(client, run.info.run_id, exp_id, tracking_uri)

    def child(self, run_name: str, *, key: str | None = None,
              tags: Mapping[str, str] | None = None) -> MlflowRun:
        """A nested run in the same experiment."""
        exp = self.client.get_experiment(self.experiment_id).name
        return MlflowRun.open(self.tracking_uri, exp, run_name=run_name, key=key,
                              parent_run_id=self.run_id, tags=tags)

    # ---- writing ----------------------------------------------------------------------------

    def log_params(self, params: Mapping[str, str]) -> list[str]:
        """Log params; on a re-attached run, keys whose value changed since (e.g. a resumed
        job with a new ``train.stop_after``) are not re-logged (MLflow params are immutable)
        but listed in the tag ``vlp.changed_on_resume``. Returns the changed keys."""
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        new = {k: v for k, v in params.items() if k not in existing}
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        items = [Param(k, v) for k, v in new.items()]
        for i in range(0, len(items), _MAX_BATCH_PARAMS):
            self.client.log_batch(self.run_id, params=items[i:i + _MAX_BATCH_PARAMS])
        if changed:
            self.client.set_tag(self.run_id, "vlp.changed_on_resume", ",".join(changed)[:5000])
        return changed

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self.log_metric_rows([(step, metrics)])

    def log_metric_rows(self, rows: Iterable[tuple[int, Mapping[str, float]]],
                        timestamp_ms: int | None = None) -> None:
        """Many steps in few calls (one SQLite transaction per 1000 values). ``timestamp_ms``
        fixed by the caller makes a retry idempotent: a batch the server stored before its
        answer was lost (a server killed mid-request) is the same rows again, which MLflow's
        SQL store merges instead of adding a second row per step."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        items = [Metric(k, float(v), now, int(step)) for step, m in rows for k, v in m.items()]
        for i in range(0, len(items), _MAX_BATCH_METRICS):
            self.client.log_batch(self.run_id, metrics=items[i:i + _MAX_BATCH_METRICS])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, redact(str(v)))

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, redact(text), artifact_file)

    def log_dict(self, data: dict, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, data, artifact_file)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        self.client.log_figure(self.run_id, figure, artifact_file)

    def log_artifact(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(local_path), artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)

    # ---- reading ----------------------------------------------------------------------------

    def metric_history(self, key: str) -> list[tuple[int, float]]:
        """(step, value), one per step (the latest write wins: steps re-run after a restart
        are logged again)."""
        by_step: dict[int, tuple[int, float]] = {}
        for m in self.client.get_metric_history(self.run_id, key):
            if m.step not in by_step or m.timestamp >= by_step[m.step][0]:
                by_step[m.step] = (m.timestamp, m.value)
        return [(s, v) for s, (_, v) in sorted(by_step.items())]


def _experiment_id(client: Any, name: str, artifact_location: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except Exception:  # another process created it in between
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


# ---- plots ----------------------------------------------------------------------------------

def loss_curve_figure(curves: Mapping[str, Sequence[tuple[int, float]]], title: str = "") -> Any:
    """One line per curve (step, value); Agg canvas, no pyplot global state (safe in workers)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, points in curves.items():
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, label=name, linewidth=1.2)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if title:
        ax.set_title(title)
    if curves:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
