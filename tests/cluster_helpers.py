"""Helpers for the tests that start real services the way users do (`ray start`, `mlflow
server`, moto's S3 server): free ports, waiting for HTTP, and stopping a process tree by its
process group, never `ray stop` (which would end every Ray on the machine)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from vlp.platform.cluster.ray_session import free_local_port

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent    # the venv's bin (not resolved: a venv's python is a link)
S3_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}


def stop_tree(*pgids: int, grace_s: float = 5.0) -> None:
    """SIGTERM every process of the groups ``pgids`` and all their descendants (Ray workers
    get process groups of their own but stay children of the raylet), SIGKILL what is left.
    Several groups (a cluster's nodes) are signalled together and waited for once."""
    procs: dict[int, psutil.Process] = {}
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in pgids:
                procs[p.pid] = p
                procs.update((c.pid, c) for c in p.children(recursive=True))
        except (psutil.Error, OSError):
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs.values():
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not [p for p in procs.values() if _alive(p)]:
                return
            time.sleep(0.2)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_http(url: str, timeout_s: float, headers=None, proc=None) -> None:
    """Until ``url`` answers at all (any HTTP status); fails at once if ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc is None or proc.poll() is None, f"{proc.args[:2]} exited: {proc.returncode}"
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=5)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {timeout_s:.0f} s")


class S3Server:
    """moto's standalone S3 server on 127.0.0.1 (``moto_server``, from ``moto[server]``);
    ``env`` is what a node's environment holds to reach it (endpoint + test keys)."""

    def __init__(self, log_dir: Path):
        self.port = free_local_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ENDPOINT_URL": self.endpoint, **S3_KEYS}
        self._log = open(Path(log_dir) / "moto.log", "w")
        self.proc = subprocess.Popen([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p",
                                      str(self.port)], stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(self.endpoint, 300, proc=self.proc)
        except BaseException:
            self.stop()
            raise

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{self.port}", scheme="http",
                                 access_key=S3_KEYS["AWS_ACCESS_KEY_ID"],
                                 secret_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"],
                                 region="us-east-1", allow_bucket_creation=True)

    def create_bucket(self, name: str) -> str:
        """Creates it when it is not there yet (the server is shared by the session)."""
        self.filesystem().create_dir(name)
        return f"s3://{name}"

    def upload(self, local: Path, key: str) -> str:
        """The file ``local`` as object ``key`` (``bucket/path``), or every file of the folder
        ``local`` under that prefix; returns its ``s3://`` URI."""
        local, fs = Path(local), self.filesystem()
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for f in files:
            dest = key if f == local else f"{key}/{f.relative_to(local).as_posix()}"
            with fs.open_output_stream(dest) as out:
                out.write(f.read_bytes())
        return f"s3://{key}"

    def stop(self) -> None:
        stop_tree(self.proc.pid)
        self._log.close()


def bashrc_env(setup_commands: list[str], home: Path, bucket: str,
               head_ip: str | None = None) -> dict[str, str]:
    """What cluster.yaml's ``setup_commands`` leave in a node's ``~/.bashrc``, as the
    environment a shell (and so ``ray start``, its job drivers and workers) gets from it:
    the commands that write ``~/.bashrc`` (not the venv's activation) run in bash with HOME
    at ``home``, ``VLP_BUCKET`` replaced by ``bucket``, and ``RAY_HEAD_IP`` set as Ray's
    updater sets it on a worker (``head_ip``) or unset as on the head (None). Only the
    variables the file sets are returned."""
    home.mkdir(parents=True, exist_ok=True)
    (home / ".bashrc").write_text("")
    cmds = [c for c in setup_commands if "~/.bashrc" in c and "vlp-venv" not in c]
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    if head_ip is not None:
        env["RAY_HEAD_IP"] = head_ip
    for cmd in cmds:
        subprocess.run(["bash", "-c", cmd], env=env, check=True, timeout=30)
    text = (home / ".bashrc").read_text()
    text = re.sub(r"^export VLP_BUCKET=.*$", f"export VLP_BUCKET={bucket}", text, flags=re.M)
    (home / ".bashrc").write_text(text)
    out = subprocess.run(["bash", "-c", "source ~/.bashrc && env -0"], env={**env, "HOME": str(home)},
                         capture_output=True, text=True, check=True, timeout=30).stdout
    after = dict(kv.split("=", 1) for kv in out.split("\0") if "=" in kv)
    return {k: v for k, v in after.items() if env.get(k) != v and k not in ("PWD", "SHLVL", "_")}


def shipped_gpu_configs(configs: Path) -> list[Path]:
    """The configs under ``configs`` whose workers ask for GPUs (a sweep's under its
    ``pretrain`` section)."""
    import yaml

    out = []
    for path in sorted(configs.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        pre = raw.get("pretrain") if isinstance(raw.get("pretrain"), dict) else {}
        if raw.get("scaling", {}).get("use_gpu") or pre.get("scaling", {}).get("use_gpu"):
            out.append(path)
    return out


# ---- a multi-node Ray cluster on one machine --------------------------------------------

# The GCS marks a node dead after this many failed health checks in a row (Ray's default: 5,
# one every 3 s: 15 s of a test's waiting after the raylet kill). A killed raylet refuses the
# connection at once; a live raylet on a loaded machine still has each check's full timeout
# (10 s, unchanged) to answer, so 3 checks 1 s apart find the dead node in ~3 s without
# marking a slow one dead.
HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


class Cluster:
    def __init__(self, env: dict, temp: Path, head_cpus: int = 1,
                 nodes: tuple[tuple[str, int], ...] = (("node_b", 2), ("node_c", 2))):
        """A head with ``head_cpus`` CPUs and the worker nodes ``nodes`` (resource name,
        CPUs), started with ``ray start`` on 127.0.0.1 with the environment ``env``."""
        # Ray's Unix sockets live under the temp dir, and a socket's path may not pass 107
        # bytes: pytest's own temp paths (longer under xdist's popen-gwN, and a worker node's
        # `node_b/session_<date>_<pid>/sockets/plasma_store` below them) leave too little
        # room, and the head then never answers. ``temp`` links to the short one, so the
        # cluster's files stay where the test's other files are.
        short = Path(tempfile.mkdtemp(prefix="vlp-ray-", dir="/tmp"))
        temp.mkdir(parents=True, exist_ok=True)
        (temp / "ray").symlink_to(short)
        self.env, self.temp = env, short
        self.node_names = ("head_node", *(name for name, _ in nodes))
        self.port, dash = free_local_port(), free_local_port()
        self.address = f"http://127.0.0.1:{dash}"
        self.groups: list[int] = []
        try:
            self._start(["--head", "--port", str(self.port), "--dashboard-host", "127.0.0.1",
                         "--dashboard-port", str(dash), "--ray-client-server-port",
                         str(free_local_port()), "--temp-dir", str(self.temp),
                         "--num-cpus", str(head_cpus),
                         "--resources", json.dumps({"head_node": 1}),
                         "--system-config", json.dumps(HEALTH_CHECK)])
            wait_http(f"{self.address}/api/version", 300,
                      {"Authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"})
            # the two worker nodes join at the same time; each has a temp dir of its own:
            # the default /tmp/ray is shared with every other Ray on the machine (unpacked
            # job packages included)
            self._start(*[["--address", f"127.0.0.1:{self.port}", "--num-cpus", str(cpus),
                           "--temp-dir", str(self.temp / name),
                           "--resources", json.dumps({name: 1})]
                          for name, cpus in nodes])
        except BaseException:       # interrupted or failed while starting: stop what runs
            self.stop()
            raise

    def _start(self, *nodes: list[str]) -> None:
        """`ray start` with each of ``nodes``' arguments, all at once; returns when all
        have."""
        starts = []
        for args in nodes:
            cmd = [str(BIN / "ray"), "start", "--node-ip-address", "127.0.0.1",
                   "--dashboard-agent-listen-port", str(free_local_port()),
                   "--metrics-export-port", str(free_local_port()),
                   "--object-store-memory", str(512 << 20), "--disable-usage-stats", *args]
            start = subprocess.Popen(cmd, env=self.env, cwd=ROOT, start_new_session=True,
                                     text=True, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
            self.groups.append(start.pid)
            starts.append((start, args))
        for start, args in starts:
            out, _ = start.communicate(timeout=600)
            assert start.returncode == 0, f"ray start {' '.join(args[:2])} failed:\n{out}"

    def raylets(self) -> dict[str, psutil.Process]:
        """Custom resource name → raylet process, for this cluster's nodes."""
        out = {}
        for p in psutil.process_iter(["name", "cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                if p.info["name"] == "raylet" and str(self.temp) in cmd:
                    for name in self.node_names:
                        if name in cmd:
                            out[name] = p
            except psutil.Error:
                pass
        return out

    def train_worker_nodes(self) -> list[str]:
        """Nodes whose raylet runs a Ray Train worker process."""
        found = []
        for name, raylet in self.raylets().items():
            for child in raylet.children(recursive=True):
                try:
                    if "RayTrainWorker" in child.name() + " ".join(child.cmdline()):
                        found.append(name)
                        break
                except psutil.Error:
                    pass
        return found

    def submit(self, workdir: Path, job_id: str, entry: list[str], env_vars: dict,
               log: Path, program: str = "python") -> subprocess.Popen:
        cmd = [str(BIN / "ray"), "job", "submit", "--address", self.address, "--working-dir",
               str(workdir), "--submission-id", job_id, "--runtime-env-json",
               json.dumps({"env_vars": env_vars}), "--", program, *entry]
        return subprocess.Popen(cmd, env=self.env, cwd=workdir, stdout=open(log, "w"),
                                stderr=subprocess.STDOUT, text=True)

    def stop(self) -> None:
        stop_tree(*self.groups)
        shutil.rmtree(self.temp, ignore_errors=True)
