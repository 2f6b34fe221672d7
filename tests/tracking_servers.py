"""The cluster's tracking stack on one machine, started as cluster.yaml starts it on the head:
a PostgreSQL server (the binaries of the ``pgserver`` wheel, the test extra: no OS package
needed on a fresh machine) holding the ``mlflow`` database, reached over its Unix socket as
cluster.yaml's
``postgresql+psycopg2://ubuntu@/mlflow?host=/var/run/postgresql``, and ``mlflow server
--backend-store-uri postgresql+psycopg2://... --artifacts-destination s3://BUCKET/mlflow`` in front of
it (moto's S3 server). ``MlflowServer.kill`` / ``start`` stand in for systemd's restart.

PostgreSQL refuses to run as root: as root (CI, containers) the server runs as a system user
of its own (``vlp-postgres``, created once with ``useradd``), as the OS package's
``postgres`` user does."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from cluster_helpers import BIN, stop_tree, wait_http
from vlp.platform.cluster.ray_session import free_local_port
from vlp.platform.tracking.server_env import server_env

PG_USER = "vlp-postgres"


def postgres_bin() -> Path:
    import pgserver

    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def _run_as() -> dict:
    """Popen keywords that run PostgreSQL as a non-root user when this process is root."""
    if os.geteuid() != 0:
        return {}
    import pwd

    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        PG_USER], check=True, capture_output=True)
    return {"user": PG_USER, "group": pwd.getpwnam(PG_USER).pw_gid}


class PostgresServer:
    """initdb + postgres on a Unix socket only (no TCP port), fsync off (a test's data), and
    the database ``mlflow``; ``uri`` is SQLAlchemy's, for ``--backend-store-uri``."""

    def __init__(self):
        # not under pytest's tmp folder: that is private to root, and the server may not be
        self.root = Path(tempfile.mkdtemp(prefix="vlp-pg-"))
        self.data, self.socket = self.root / "data", self.root / "socket"
        self.socket.mkdir()
        user = _run_as()
        if user:
            os.chown(self.root, _uid(), user["group"])
            os.chown(self.socket, _uid(), user["group"])
        pg = postgres_bin()
        self._log = open(self.root / "postgres.log", "w")
        subprocess.run([str(pg / "initdb"), "-D", str(self.data), "-U", "postgres",
                        "--auth=trust", "--encoding=UTF8", "--no-sync"], check=True,
                       stdout=self._log, stderr=subprocess.STDOUT, **user)
        self.proc = subprocess.Popen(
            [str(pg / "postgres"), "-D", str(self.data), "-k", str(self.socket), "-h", "",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "max_connections=100"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, **user)
        try:
            self._wait_ready(pg)
            subprocess.run([str(pg / "createdb"), "-h", str(self.socket), "-U", "postgres",
                            "mlflow"], check=True, capture_output=True)
        except BaseException:
            self.stop()
            raise
        # the driver named, as cluster.yaml does: SQLAlchemy 2.1 takes psycopg 3 for postgresql://
        self.uri = f"postgresql+psycopg2://postgres@/mlflow?host={self.socket}"

    def _wait_ready(self, pg: Path, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, \
                f"postgres exited: {(self.root / 'postgres.log').read_text()[-2000:]}"
            if subprocess.run([str(pg / "pg_isready"), "-h", str(self.socket), "-q"]).returncode == 0:
                return
            time.sleep(0.3)
        raise TimeoutError(f"postgres did not start in {timeout_s:.0f} s")

    def query(self, sql: str, *args) -> list[tuple]:
        import psycopg2

        with psycopg2.connect(host=str(self.socket), user="postgres", dbname="mlflow") as conn:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall()

    def stop(self) -> None:
        stop_tree(self.proc.pid)
        self._log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _uid() -> int:
    import pwd

    return pwd.getpwnam(PG_USER).pw_uid


class MlflowServer:
    """``mlflow server`` with cluster.yaml's stores: ``backend`` (Postgres) and artifacts
    proxied into ``s3://BUCKET/mlflow``. Same port across restarts, as systemd's unit."""

    # one worker (requests still served concurrently, from its thread pool): with several,
    # uvicorn's supervisor kills a worker that misses its 5 s health check, and on a 2-core
    # machine at load 55 every worker did while importing MLflow, so the server never came up
    def __init__(self, backend: str, s3, bucket: str, folder: Path, workers: int = 1):
        self.backend, self.s3, self.bucket, self.folder = backend, s3, bucket, folder
        self.workers = workers
        self.port = free_local_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.artifacts = f"s3://{bucket}/mlflow"
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.start()

    def start(self, timeout_s: float = 300) -> None:
        self.starts += 1
        log = open(self.folder / f"mlflow-server-{self.starts}.log", "w")
        env = server_env({**os.environ, **self.s3.env,
                          "MLFLOW_S3_ENDPOINT_URL": self.s3.endpoint})
        self.proc = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--backend-store-uri", self.backend,
             "--artifacts-destination", self.artifacts, "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", str(self.workers)],
            env=env, cwd=self.folder, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True)
        log.close()
        try:
            wait_http(f"{self.uri}/health", timeout_s, proc=self.proc)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """As a crash or ``systemctl restart`` ends it: the whole process group, at once."""
        if self.proc is not None:
            stop_tree(self.proc.pid, grace_s=2.0)
            self.proc.wait(timeout=30)       # reaped: no zombie left behind
            self.proc = None

    def log_text(self) -> str:
        return "".join(p.read_text() for p in sorted(self.folder.glob("mlflow-server-*.log")))


class TrackingStack:
    """Postgres + the MLflow server over it, artifacts in moto's S3: what the tests of the
    cluster's tracking share (``tracking_stack`` fixture)."""

    def __init__(self, s3, folder: Path, bucket: str = "vlp-tracking"):
        self.s3 = s3
        self.bucket = bucket
        s3.create_bucket(bucket)
        self.postgres = PostgresServer()
        try:
            self.mlflow = MlflowServer(self.postgres.uri, s3, bucket, folder)
        except BaseException:
            self.postgres.stop()
            raise
        self.uri = self.mlflow.uri

    def stop(self) -> None:
        try:
            self.mlflow.kill()
        finally:
            self.postgres.stop()
