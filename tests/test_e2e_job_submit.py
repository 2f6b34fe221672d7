"""End to end, the way users work: `ray start --head`, an MLflow server, the tiny world from
`vlp data synth`, and a two-trial sweep sent with `ray job submit --working-dir .`; then the
runs are read back through MLflow's client and the MLflow UI is screenshotted in headless
Chromium (runs/e2e/mlflow-ui.png, for a human to look at).

The cluster is this file's own: token auth with its own token (env, not ~/.ray), its own
ports and --temp-dir (so its ray_current_cluster file is written there, not in /tmp/ray).
It is stopped by killing its own processes: `ray stop` would stop every Ray on the machine,
the session's `ray_local` instance included. The venv's bin goes first on PATH for
`ray start`, as an activated venv would: the job's `python` is whatever the raylet's PATH
finds."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from cluster_helpers import BIN, stop_tree, wait_http

from vlp.platform.cluster.ray_session import free_local_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT_COPY = ROOT / "runs" / "e2e" / "mlflow-ui.png"
SWEEP = "e2e-sweep"
JOB_TIMEOUT_S = 1200                       # the job takes minutes; a loaded 2-core box, more


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def chromium() -> str:
    """/usr/bin/chromium, installed from Debian when missing (CI images have only Python,
    make and gcc)."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("needs Chromium: `apt-get install chromium` (Debian) as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}"
    found = shutil.which("chromium")
    assert found, "apt-get installed chromium but it is not on PATH"
    return found


@pytest.fixture(scope="module")
def user_env() -> dict[str, str]:
    """A shell with the venv activated, token auth on with a token of our own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(BIN.parent),
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex,
               RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    return env


@pytest.fixture(scope="module")
def ray_head(user_env, tmp_path_factory):
    """`ray start --head` on 127.0.0.1; yields the dashboard (job API) address."""
    temp = tmp_path_factory.mktemp("ray")
    dash = free_local_port()
    cmd = [str(BIN / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1",
           "--port", str(free_local_port()), "--dashboard-host", "127.0.0.1",
           "--dashboard-port", str(dash), "--ray-client-server-port", str(free_local_port()),
           "--dashboard-agent-listen-port", str(free_local_port()), "--num-cpus", "4",
           "--object-store-memory", str(1 << 30), "--temp-dir", str(temp),
           "--disable-usage-stats"]
    # its own session: the head's processes share its process group, which stop_tree ends
    start = subprocess.Popen(cmd, env=user_env, cwd=ROOT, start_new_session=True, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = start.communicate(timeout=180)
        assert start.returncode == 0, f"ray start failed:\n{out}"
        address = f"http://127.0.0.1:{dash}"
        wait_http(f"{address}/api/version", 60,
                  {"Authorization": f"Bearer {user_env['RAY_AUTH_TOKEN']}"})
        yield address
    finally:
        stop_tree(start.pid)


@pytest.fixture(scope="module")
def mlflow_server(user_env, tmp_path_factory):
    """`mlflow server` with a SQLite store and a proxied artifact root; yields its URI."""
    d = tmp_path_factory.mktemp("mlflow")
    port = free_local_port()
    log = open(d / "server.log", "w")
    proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--backend-store-uri",
                             f"sqlite:///{d / 'mlflow.db'}", "--artifacts-destination",
                             str(d / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1"],
                            env=user_env, cwd=d, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 120, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_tree(proc.pid)
        log.close()


@pytest.fixture(scope="module")
def sweep_job(ray_head, mlflow_server, user_env, tmp_path_factory):
    """The tiny world from the CLI, then the sweep as a Ray job: 2 trials (no pretraining and
    the paper's best mix: 4 pretraining steps), one finetune benchmark of 2 steps."""
    d = tmp_path_factory.mktemp("e2e")
    synth = subprocess.run([str(BIN / "vlp"), "data", "synth", "--scale", "tiny", "--out",
                            str(d / "world")], env=user_env, cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert synth.returncode == 0, synth.stdout + synth.stderr
    job_id = f"vlp-e2e-{uuid.uuid4().hex[:8]}"
    runtime_env = {"env_vars": {"MLFLOW_TRACKING_URI": mlflow_server}}
    cmd = [str(BIN / "ray"), "job", "submit", "--address", ray_head, "--working-dir", ".",
           "--submission-id", job_id, "--runtime-env-json", json.dumps(runtime_env), "--",
           "python", "jobs/sweep.py", "--config", "jobs/configs/sweep-tiny.yaml",
           "--name", SWEEP, "--samples", "2", "--world", str(d / "world"),
           "--output-dir", str(d / "runs"), "--set", "finetune.benchmarks=[retrieval]"]
    try:
        job = subprocess.run(cmd, env=user_env, cwd=ROOT, capture_output=True, text=True,
                             timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        job = None
    if job is None or job.returncode != 0:
        logs = subprocess.run([str(BIN / "ray"), "job", "logs", "--address", ray_head, job_id],
                              env=user_env, capture_output=True, text=True, timeout=120)
        subprocess.run([str(BIN / "ray"), "job", "stop", "--address", ray_head, job_id],
                       env=user_env, capture_output=True, timeout=120)
        why = "timed out" if job is None else f"exited {job.returncode}"
        pytest.fail(f"ray job submit {why}; ray job logs {job_id}:\n{logs.stdout[-8000:]}"
                    f"{logs.stderr[-2000:]}\nsubmit output:\n"
                    f"{'' if job is None else (job.stdout + job.stderr)[-4000:]}")
    return mlflow_server, job.stdout + job.stderr


# ---- tests ------------------------------------------------------------------------------------

def test_submitted_sweep_records_its_runs_in_the_mlflow_server(sweep_job, capsys, tmp_path):
    from mlflow.tracking import MlflowClient

    from vlp.cli import main

    uri, out = sweep_job
    assert f"Leaderboard of {SWEEP}" in out and f"Job '" in out and "succeeded" in out
    assert "4 CPUs in the cluster" in out       # attached to the head, no private local Ray
    assert f"in {uri}" in out                   # MLFLOW_TRACKING_URI reached the job
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("vlp-sweep")
    parents = client.search_runs([exp.experiment_id], "tags.`vlp.job` = 'sweep'")
    assert [p.info.run_name for p in parents] == [SWEEP]
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["vlp.state"] == "completed"
    assert parent.data.metrics["trials"] == 2 and parent.data.metrics["trial_errors"] == 0
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "leaderboard")} == {
        "leaderboard/leaderboard.md", "leaderboard/leaderboard.csv",
        "leaderboard/leaderboard.json", "leaderboard/meta_sum.png"}
    # `vlp leaderboard` prints the table the sweep logged, from the same runs
    logged = client.download_artifacts(parent.info.run_id, "leaderboard/leaderboard.md",
                                       str(tmp_path))
    table = [line for line in Path(logged).read_text().splitlines() if line.startswith("|")]
    assert len(table) == 2 + 2
    capsys.readouterr()
    assert main(["leaderboard", "--tracking-uri", uri, "--experiment", "vlp-sweep"]) == 0
    assert [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("|")] == table

    trials = {t.data.tags["vlp.sweep.trial"]: t for t in client.search_runs(
        [exp.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")}
    assert sorted(trials) == ["t001", "t002"]
    for t in trials.values():
        assert t.info.status == "FINISHED"
        assert 0 <= t.data.metrics["ir"] <= 100 and 0 <= t.data.metrics["tr"] <= 100
        assert t.data.metrics["score"] == pytest.approx(t.data.metrics["ir"]
                                                        + t.data.metrics["tr"])
    assert trials["t002"].data.tags["mix"] == "MLM+ITM+MRC-kl+MRFR"   # the paper's best
    assert trials["t002"].data.tags["pretraining_data"] == "In-domain"

    below = {r.info.run_name: r for r in client.search_runs(
        [exp.experiment_id], f"tags.`mlflow.parentRunId` = '{trials['t002'].info.run_id}'")}
    assert sorted(below) == ["t002-ft-retrieval", "t002-pretrain"]
    pre = below["t002-pretrain"]
    assert pre.info.status == "FINISHED"
    losses = client.get_metric_history(pre.info.run_id, "loss")
    assert [m.step for m in losses] == [1, 2, 3, 4]         # pretrain.train.steps: 4
    assert all(math.isfinite(m.value) for m in losses) and "mlm_loss" in pre.data.metrics
    arts = {a.path for a in client.list_artifacts(pre.info.run_id)}
    assert {"config", "plots", "checkpoint"} <= arts
    assert [a.path for a in client.list_artifacts(pre.info.run_id, "plots")] == [
        "plots/loss_curve.png"]
    assert client.list_artifacts(below["t002-ft-retrieval"].info.run_id, "predictions")


def test_mlflow_ui_shows_the_leaderboard(sweep_job, chromium, tmp_path):
    """The MLflow UI as a user opens it from `vlp ui`'s leaderboard link: the view the sweep
    saved on its experiment (MLflow's "share view" state: an experiment tag named in the
    URL) shows its trials under a Meta-Sum column, best first."""
    from mlflow.tracking import MlflowClient

    from vlp.platform.tracking.leaderboard_view import META_SUM_COLUMN, leaderboard_url

    uri, _ = sweep_job
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("vlp-sweep")
    trials = client.search_runs([exp.experiment_id], "tags.`vlp.job` = 'sweep-trial'")
    ranked = sorted(trials, key=lambda t: -t.data.metrics[META_SUM_COLUMN])
    url = leaderboard_url(uri, uri)
    assert url is not None and url.startswith(f"{uri}/#/experiments/{exp.experiment_id}/runs")
    png = tmp_path / "mlflow-ui.png"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--window-size=1600,1000", "--virtual-time-budget=15000"]

    def browse(name: str, *what: str) -> subprocess.CompletedProcess:
        return subprocess.run([chromium, *flags, f"--user-data-dir={tmp_path / name}", *what,
                               url], capture_output=True, text=True, timeout=180)

    dom = browse("profile-dom", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-3000:]
    # the JS app rendered the leaderboard (not a spinner, not the GenAI overview): the
    # Meta-Sum column, and the trials in its order, the best first
    page = dom.stdout
    assert META_SUM_COLUMN in page, "no Meta-Sum column in the rendered page"
    for t in ranked:
        assert t.info.run_name in page, f"{t.info.run_name!r} not in the rendered page"
    for better, worse in zip(ranked, ranked[1:]):     # a tie may show in either order
        if better.data.metrics[META_SUM_COLUMN] > worse.data.metrics[META_SUM_COLUMN]:
            assert page.index(better.info.run_name) < page.index(worse.info.run_name), \
                f"{better.info.run_name!r} (the higher Meta-Sum) is not above {worse.info.run_name!r}"
    shot = browse("profile-shot", f"--screenshot={png}")
    assert shot.returncode == 0 and png.is_file(), shot.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    SCREENSHOT_COPY.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, SCREENSHOT_COPY)
