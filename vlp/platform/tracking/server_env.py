"""The environment every MLflow server vlp starts runs with (``vlp ui``, cluster.yaml's
systemd unit, the test suite's servers).

MLflow 3 starts a job runner beside its server by default: one ``_job_runner`` and seven
``huey_consumer`` processes, each importing MLflow, for its GenAI jobs (judges, scorers,
trace roll-ups). vlp submits no such job. Measured on a 2-core machine (sqlite store, one
worker): with the runner, 10 processes, ~21 CPU seconds, healthy after 17 s; without it, 2
processes, ~5 CPU seconds, healthy after 8 s.
"""

from __future__ import annotations

SERVER_ENV: dict[str, str] = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def server_env(base: dict[str, str]) -> dict[str, str]:
    """``base`` with ``SERVER_ENV`` over it."""
    return {**base, **SERVER_ENV}
