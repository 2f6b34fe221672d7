"""The multi-node path on one machine, every part started the way its users start it: a Ray
cluster of a head and two worker nodes (`ray start --head`, `ray start --address`, each its
own raylet with a custom resource), moto's S3 server as the only shared storage, a real
`mlflow server` whose artifact root is in that bucket, and jobs sent with `ray job submit`.

The nodes' environment is what cluster.yaml writes into every node's ~/.bashrc
(VLP_STORAGE=s3://$VLP_BUCKET/runs, the head's MLFLOW_TRACKING_URI) plus the S3 endpoint and
test keys (what an instance profile gives a cloud node).

First `vlp doctor` checks the three nodes (devices, all-reduce within and between them,
the S3 storage written and read back across nodes, the tracking server, DeepSpeed's ops, a
training step). One pretraining job — the shipped GPU config uniter-base-indomain.yaml as it stands, sizes
overridden (tiny family, the tiny world in the bucket, 2 CPU workers spread over the nodes),
storage and tracking from the nodes' environment alone — loses a worker node (`kill -9` of
its raylet) after its first checkpoint and must resume from the S3 checkpoint on the
remaining nodes, end at exactly its configured step with one MLflow run, and leave no run
files under the job's working folder. Resubmitting it after a code edit (a new
_ray_pkg_<hash>) finds the finished run (its S3 checkpoint, its MLflow run) instead of
restarting, and a finetune reads its S3 checkpoint and
the world (manifest, task tables, image shards) from the bucket. A tiny two-trial sweep over
that world (sweep-tiny.yaml: no pretraining, then the paper's best mix), in the same bucket,
is stopped after its first trial checkpoint (SIGUSR1, as Ctrl-C); a second submission, as
users resume one (`jobs/sweep.py`), completes it with Tuner.restore from S3, the trial
resuming from its Tune checkpoint there. Its runs are then read back through MLflow's client
and `vlp leaderboard`, and the MLflow UI is screenshotted in headless Chromium
(runs/e2e/mlflow-ui.png, for a human to look at). With VLP_ALL_GPU_CONFIGS=1, every shipped
GPU pretraining config runs the same way (~6 minutes).

The cluster is this file's own (token auth with its own token, its own ports and temp dir)
and is stopped by killing its own process groups, never `ray stop`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml
from cluster_helpers import (BIN, Cluster, bashrc_env, shipped_gpu_configs, stop_tree,
                             wait_http)

from vlp.platform.cluster.ray_session import free_local_port
from vlp.platform.tracking.server_env import server_env

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOT_COPY = ROOT / "runs" / "e2e" / "mlflow-ui.png"
BUCKET = "vlp-multinode"
PRETRAIN_CONFIG = "uniter-base-indomain.yaml"   # the README's example of a cluster run
RUN = "uniter-base-indomain"                    # its run.name
WORLD = f"s3://{BUCKET}/world"  # the tiny world, copied into the bucket as it is
SHARDS = "world/images"        # the pretraining shards' folder in the bucket
# the kill comes after the step-4 checkpoint: 8 steps and two checkpoints (one deleted by
# keep: 2) are left to run after the resume
STEPS, INTERVAL = 12, 4
JOB_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def s3(s3_server):
    s3_server.create_bucket(BUCKET)
    return s3_server


@pytest.fixture(scope="module")
def node_env(s3, tmp_path_factory):
    """A node's shell: the venv first on PATH, token auth with our own token, the S3
    endpoint and keys (an instance profile's part on a cloud node), and what cluster.yaml
    writes into every node's ~/.bashrc: VLP_STORAGE in the bucket and the head's MLflow
    server (its address and port replaced by the test server's)."""
    cfg = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    bashrc = bashrc_env(cfg["setup_commands"], tmp_path_factory.mktemp("home"), BUCKET)
    tracking = re.sub(r"//[^/]+$", f"//127.0.0.1:{free_local_port()}",
                      bashrc["MLFLOW_TRACKING_URI"])
    # PYTHONDONTWRITEBYTECODE (set on CI machines, not by cluster.yaml) left out as on a
    # node: the first process to import the job package's vlp writes its bytecode for the
    # rest, where each compiled it from source (~0.3 CPU s a process)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_ADDRESS", "VLP_STORAGE", "MLFLOW_TRACKING_URI",
                                "PYTHONDONTWRITEBYTECODE"))}
    env.update(VLP_STORAGE=bashrc["VLP_STORAGE"], MLFLOW_TRACKING_URI=tracking,
               NCCL_SOCKET_IFNAME=bashrc["NCCL_SOCKET_IFNAME"])
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(BIN.parent),
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=uuid.uuid4().hex,
               RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1", **s3.env,
               # Ray's memory monitor watches the whole machine: on a shared box it kills
               # our workers for other programs' memory
               RAY_memory_monitor_refresh_ms="0")
    return env


@pytest.fixture(scope="module")
def mlflow_process(s3, node_env, tmp_path_factory):
    """The `mlflow server` process, started (the cluster fixture asks for it first: the
    server boots while the nodes start); ``mlflow_server`` waits until it answers."""
    d = tmp_path_factory.mktemp("mlflow")
    port = int(node_env["MLFLOW_TRACKING_URI"].rsplit(":", 1)[1])   # cluster.yaml's address
    log = open(d / "server.log", "w")
    proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--backend-store-uri",
                             f"sqlite:///{d / 'mlflow.db'}", "--artifacts-destination",
                             f"s3://{BUCKET}/mlartifacts", "--host", "127.0.0.1", "--port",
                             str(port), "--workers", "1"],
                            env=server_env({**node_env, "MLFLOW_S3_ENDPOINT_URL": s3.endpoint}),
                            cwd=d,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, port
    finally:
        stop_tree(proc.pid)
        log.close()


@pytest.fixture(scope="module")
def mlflow_server(mlflow_process):
    proc, port = mlflow_process
    wait_http(f"http://127.0.0.1:{port}/health", 600, proc=proc)   # minutes when loaded
    return f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def cluster(node_env, mlflow_process, tmp_path_factory):
    c = Cluster(node_env, tmp_path_factory.mktemp("ray"))
    try:
        yield c
    finally:
        c.stop()


# ---- issue 27: every shipped GPU pretraining config as it stands --------------------------

TINY = {"uniter-base": "uniter-tiny", "uniter-large": "uniter-tiny",
        "vlbert-base": "vlbert-tiny", "imagebert-base": "imagebert-tiny",
        "soho-r18-l3": "soho-tiny"}
TINY_SOURCE = {"web": "cc", "vcr": "coco"}      # corpora the tiny world lacks: stand-ins


def shipped_gpu_pretrain_configs() -> list[Path]:
    """The shipped configs that `jobs/pretrain.py` runs on GPU workers (the Table 3 sweep is
    checked against the read-only mount by test_gpu_config_paths.py and runs its trials
    through the same pretraining path)."""
    return [p for p in shipped_gpu_configs(ROOT / "jobs" / "configs")
            if "run" in yaml.safe_load(p.read_text())]


def size_overrides(raw: dict) -> list[str]:
    """What makes a GPU config fit this machine, sizes only: the tiny family with random
    weights and the packaged vocab (the config's files live on the cluster's read-only
    mount), the tiny world in the bucket, a few steps on one CPU worker. Storage, tracking,
    precision and ZeRO stay as shipped."""
    out = [f"model.family={TINY[raw['model']['family']]}", "model.init=random",
           "model.init_path=", "data.tokenizer_path=", "data.batch_input_units=1024",
           "data.bucket_window=512", "optimizer.warmup_steps=1", "checkpoint.interval=2",
           "train.log_every=1", "scaling.num_workers=1", "scaling.use_gpu=false",
           "scaling.accelerator_type=", "scaling.cpus_per_worker=1"]
    if raw["model"].get("cnn_init"):        # SOHO: ImageNet weights, a step schedule
        out += ["model.cnn_init=", "model.cold_start_steps=1", "optimizer.milestones=[1]"]
    for name in raw["data"]["sources"]:
        out.append(f"data.sources.{name}.path=s3://{BUCKET}/{SHARDS}/"
                   f"{TINY_SOURCE.get(name, name)}")
    if raw.get("stages"):
        out += [f"stages.{i}.steps=2" for i in range(len(raw["stages"]))]
    else:
        out.append("train.steps=2")
    return out


@pytest.fixture(scope="module")
def workdir(tiny_world, s3, tmp_path_factory) -> Path:
    """What a user uploads with --working-dir: the code and the shipped configs; the world
    and its pretraining shards are in the bucket (every node reads them from there)."""
    d = tmp_path_factory.mktemp("work")
    for part in ("vlp", "jobs"):
        shutil.copytree(ROOT / part, d / part, ignore=shutil.ignore_patterns("__pycache__"))
    s3.upload(tiny_world, f"{BUCKET}/world")
    return d


def pretrain_entry() -> list[str]:
    """The killed job: the shipped GPU config as it stands, sizes overridden (2 CPU workers
    spread over the nodes, STEPS steps, a checkpoint every INTERVAL). No storage or tracking
    is set: both come from the nodes' environment, as cluster.yaml writes it."""
    raw = yaml.safe_load((ROOT / "jobs/configs" / PRETRAIN_CONFIG).read_text())
    sizes = size_overrides(raw) + [   # a later override of the same key wins
        f"train.steps={STEPS}", "train.log_every=2", f"checkpoint.interval={INTERVAL}",
        "checkpoint.keep=2", "scaling.num_workers=2", "scaling.placement_strategy=SPREAD",
        "run.max_failures=2", "mlflow.metric_window=1",    # a row per step, to count
        # the start-of-run interconnect check, on CPU workers too (gloo), a small buffer
        "train.interconnect_check=true", "train.interconnect_mb=4"]
    return ["jobs/pretrain.py", "--config", f"jobs/configs/{PRETRAIN_CONFIG}",
            *[a for s in sizes for a in ("--set", s)]]


def job_env(mlflow_server) -> dict:
    return {"VLP_STORAGE": f"s3://{BUCKET}/vlp", "MLFLOW_TRACKING_URI": mlflow_server,
            "VLP_DEBUG": "1"}     # a failure shows its traceback


def finish(proc: subprocess.Popen, log: Path, cluster: Cluster, job_id: str) -> str:
    try:
        proc.wait(timeout=JOB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
    out = log.read_text()
    if proc.returncode != 0:
        logs = subprocess.run([str(BIN / "ray"), "job", "logs", "--address", cluster.address,
                               job_id], env=cluster.env, capture_output=True, text=True,
                              timeout=120)
        pytest.fail(f"job {job_id} exited {proc.returncode}:\n{out[-6000:]}\nray job logs:\n"
                    f"{logs.stdout[-6000:]}")
    return out


def registered_checkpoints(s3) -> str:
    """Ray Train's checkpoint-manager snapshot in the run folder: a checkpoint named there
    has been fully uploaded and registered (a report in flight can be lost on a kill)."""
    try:
        with s3.filesystem().open_input_stream(
                f"{BUCKET}/runs/{RUN}/checkpoint_manager_snapshot.json") as f:
            return f.read().decode()
    except (OSError, FileNotFoundError):
        return ""


def s3_files(s3, prefix: str) -> list[str]:
    import pyarrow.fs as pafs

    sel = pafs.FileSelector(f"{BUCKET}/{prefix}", recursive=True, allow_not_found=True)
    return [i.path for i in s3.filesystem().get_file_info(sel) if i.type == pafs.FileType.File]


@pytest.fixture(scope="module")
def killed_job(cluster, s3, mlflow_server, workdir, tmp_path_factory):
    """The pretraining job; one worker node's raylet is SIGKILLed after the first checkpoint
    reached S3."""
    log = tmp_path_factory.mktemp("logs") / "pretrain.log"
    job_id = f"vlp-mn-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    proc = cluster.submit(workdir, job_id, pretrain_entry(), {"VLP_DEBUG": "1"}, log)
    first = f"checkpoint_step{INTERVAL:08d}"
    killed = None
    while proc.poll() is None and time.monotonic() - t0 < JOB_TIMEOUT_S:
        if first in registered_checkpoints(s3):
            nodes = [n for n in cluster.train_worker_nodes() if n != "head_node"]
            assert nodes, f"no Train worker found on a worker node: {cluster.raylets()}"
            killed = nodes[0]
            raylet = cluster.raylets()[killed]
            raylet.send_signal(signal.SIGKILL)
            killed_at = time.monotonic() - t0
            break
        time.sleep(0.5)
    assert killed, f"the job ended before its first checkpoint reached S3:\n{log.read_text()}"
    out = finish(proc, log, cluster, job_id)
    return {"out": out, "killed": killed, "killed_at_s": killed_at,
            "duration_s": time.monotonic() - t0, "job_id": job_id}


def mlflow_runs(uri: str, name: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("vlp-pretrain")
    return client, client.search_runs([exp.experiment_id], f"attributes.run_name = '{name}'")


# ---- a sweep in S3, interrupted and restored by a second submission; its runs in MLflow ----

SWEEP = "mn-sweep"
SWEEP_ENTRY = '''"""Test entry: the sweep of mn-sweep.yaml; --interrupt stops it (SIGUSR1,
Tune's stop signal, as Ctrl-C) once its first trial checkpoint is saved. The callback is
pickled with the Tune state and restored with it: the marker keeps the restored copy from
firing again."""
import os
import signal
import sys

import ray
import ray.tune


class Interrupt(ray.tune.Callback):
    def __init__(self, marker):
        self.marker = marker

    def on_trial_save(self, iteration, trials, trial, **info):
        if not os.path.exists(self.marker):
            open(self.marker, "w").write(trial.trial_id)
            os.kill(os.getpid(), signal.SIGUSR1)


if __name__ == "__main__":
    from mn_sweep import Interrupt      # pickled by its module's name, not __main__
    from vlp.platform.sweep import load_sweep_config, run_sweep

    ray.init()
    marker = sys.argv[2] if sys.argv[1] == "--interrupt" else ""
    r = run_sweep(load_sweep_config("mn-sweep.yaml"),
                  callbacks=[Interrupt(marker)] if marker else [])
    print(f"interrupted {r.interrupted} trials {r.trials} errors {r.errors}")
    print(f"sweep_dir {r.sweep_dir} trials_dir {r.trials_dir}")
    for row in r.leaderboard.rows:
        print(f"row {row.trial} {row.state}")
'''


@pytest.fixture(scope="module")
def sweep_workdir(workdir) -> Path:
    """jobs/configs/sweep-tiny.yaml over the world in the bucket, one finetune stage
    (retrieval, 2 steps): two trials one at a time, "no pretraining" (t001) then the paper's
    best mix (t002: 4 pretraining steps). Stopped once t001's first report's checkpoint is
    saved (stage 0, no compute), it must resume t001 from that Tune checkpoint in S3 and run
    t002 from scratch. Tune's stop is graceful: the trial's function runs on to its next
    report, so t001's finetune stage may end before the first job does (on a warm cluster it
    does); the restored t001 then finds that stage done in its trial folder and only closes
    its run. Its storage is the job's VLP_STORAGE (s3://), its tracking the job's
    MLFLOW_TRACKING_URI."""
    cfg = yaml.safe_load((ROOT / "jobs/configs/sweep-tiny.yaml").read_text())
    cfg["sweep"].update(name=SWEEP, num_samples=2, max_concurrent=1, scheduler="fifo")
    cfg["world"] = WORLD
    cfg["finetune"]["benchmarks"] = ["retrieval"]
    (workdir / "mn-sweep.yaml").write_text(yaml.safe_dump(cfg))
    (workdir / "mn_sweep.py").write_text(SWEEP_ENTRY)
    return workdir


@pytest.fixture(scope="module")
def restored_sweep(cluster, s3, mlflow_server, sweep_workdir, tmp_path_factory):
    """The sweep submitted with the interrupting entry, then again as users resume one:
    `jobs/sweep.py --config mn-sweep.yaml` (--verbose: the trials' own lines in the job
    log)."""
    d = tmp_path_factory.mktemp("sweep")
    t0 = time.monotonic()
    marker = d / "interrupted"
    job = f"vlp-mn-sweep-{uuid.uuid4().hex[:8]}"
    first = finish(cluster.submit(sweep_workdir, job, ["mn_sweep.py", "--interrupt",
                                                       str(marker)], job_env(mlflow_server),
                                  d / "sweep1.log"), d / "sweep1.log", cluster, job)
    t1 = time.monotonic()
    job = f"vlp-mn-sweep-again-{uuid.uuid4().hex[:8]}"
    second = finish(cluster.submit(sweep_workdir, job, ["jobs/sweep.py", "--config",
                                                        "mn-sweep.yaml", "--verbose"],
                                   job_env(mlflow_server), d / "sweep2.log"),
                    d / "sweep2.log", cluster, job)
    print(f"sweep: interrupted job {t1 - t0:.0f} s, restoring job {time.monotonic() - t1:.0f} s")
    return {"first": first, "second": second, "marker": marker, "uri": mlflow_server}


def test_an_interrupted_sweep_in_s3_completes_with_tuner_restore(restored_sweep, s3, cluster):
    first, second = restored_sweep["first"], restored_sweep["second"]
    assert restored_sweep["marker"].exists() and "interrupted True" in first, first[-4000:]
    assert f"sweep_dir s3://{BUCKET}/vlp/{SWEEP} trials_dir s3://{BUCKET}/vlp/{SWEEP}/trials-" \
        in first
    assert f"resuming the sweep in s3://{BUCKET}/vlp/{SWEEP}" in second, second[-4000:]
    # jobs/sweep.py exits 0 (finish checks it): not interrupted, not every trial failed
    assert f"Leaderboard of {SWEEP} " in second and "; 2 trials, 0 failed," in second

    files = s3_files(s3, f"vlp/{SWEEP}/")
    root = f"{BUCKET}/vlp/{SWEEP}/"
    trials = {p[len(root):].split("/")[0] for p in files if p[len(root):].startswith("trials-")}
    assert len(trials) == 1, trials                     # one instance: restored, not restarted
    tdir = root + trials.pop()
    with s3.filesystem().open_input_stream(f"{tdir}/t001/attempts.jsonl") as f:
        attempts = [json.loads(line) for line in f.read().decode().splitlines()]
    resumed = [a["resumed_after_stage"] for a in attempts]
    assert resumed in ([-1, 0], [-1, 1]), resumed
    assert re.search(r"Restored on \S+ from checkpoint: .*t001_\w+/checkpoint_000000", second)
    if resumed[1] == 0:      # stopped before its finetune stage ended: that stage reruns
        assert "t001 resumes after stage 0/1" in second, second[-4000:]
    else:                    # its stage had ended (graceful stop): nothing is recomputed
        assert "t001 resumes after stage" not in second and \
            "t001-ft-retrieval step" not in second, second[-4000:]
    # done either way, never "stopped by ASHA" (its restored last result was stage 0's)
    assert "[sweep] t001 done: Meta-Sum" in second and "t001 stopped by" not in second, \
        second[-4000:]
    assert any(p.startswith(f"{root}tune/") for p in files)             # Tune's state
    for t in ("t001", "t002"):
        assert any(p.startswith(f"{tdir}/{t}/{t}-ft-retrieval/predictions/retrieval-")
                   for p in files), t
    # nothing of the sweep under the jobs' working folders
    for pkg in cluster.temp.glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*"):
        assert not list(pkg.rglob("trials-*")) and not list(pkg.rglob("tuner.pkl")), pkg


def test_the_sweep_records_its_runs_in_the_mlflow_server(restored_sweep, cluster, capsys,
                                                         tmp_path):
    """The submitted sweep, read back the way users read it: the parent run (one across the
    interrupt and the restore) with the leaderboard artifacts `vlp leaderboard` prints, a
    run per trial with its Meta-Sum parts, and under the pretraining trial its pretraining
    (per-step losses, config, loss curve, checkpoint pointer) and finetune runs."""
    from mlflow.tracking import MlflowClient

    from vlp.cli import main

    uri, out = restored_sweep["uri"], restored_sweep["second"]
    assert "Job '" in out and "succeeded" in out
    # attached to the cluster (its live nodes: the head's 1 CPU and 2 per worker node left),
    # no private local Ray
    live = 1 + 2 * len({"node_b", "node_c"} & set(cluster.raylets()))
    assert f"{live} CPUs in the cluster" in out
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
    # pretrain.train.steps: 4, inside one window of mlflow.metric_window (10): one row, the
    # mean of the 4 steps, at the last; every step is in the run's step log
    assert [m.step for m in losses] == [4]
    assert all(math.isfinite(m.value) for m in losses) and "mlm_loss" in pre.data.metrics
    arts = {a.path for a in client.list_artifacts(pre.info.run_id)}
    assert {"config", "plots", "checkpoint"} <= arts
    assert [a.path for a in client.list_artifacts(pre.info.run_id, "plots")] == [
        "plots/loss_curve.png"]
    assert client.list_artifacts(below["t002-ft-retrieval"].info.run_id, "predictions")


def test_vlp_doctor_checks_every_node_of_the_cluster(cluster, s3, mlflow_server, workdir,
                                                     tmp_path):
    """`vlp doctor` submitted as users submit it, before the pretraining job (the cluster
    still has its three nodes), with the shipped GPU config's storage and tracking as the
    nodes' environment gives them: one table, a row per node (2 gloo ranks each: the
    all-reduce within it; the storage written, read back, and another node's file read; the
    tracking server answered; DeepSpeed loaded), one training step for the one node
    type, the all-reduce between the three nodes; exit 0; nothing left in the bucket."""
    job_id = f"vlp-mn-doctor-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    proc = cluster.submit(workdir, job_id, [
        "-m", "vlp.cli", "doctor", "--config", f"jobs/configs/{PRETRAIN_CONFIG}",
        "--storage-mb", "2", "--allreduce-mb", "4"], {}, tmp_path / "doctor.log")
    out = finish(proc, tmp_path / "doctor.log", cluster, job_id)
    print(f"doctor job took {time.monotonic() - t0:.0f} s")
    table = [line for line in out.splitlines() if line.startswith("| ")]
    print("\n".join(line for line in out.splitlines() if line.startswith(("| ", "vlp doctor"))))
    assert (f"vlp doctor: 3 node(s); run storage s3://{BUCKET}/runs; tracking {mlflow_server}"
            in out), out[-4000:]
    assert len(table) == 2 + 3 + 1, table
    nodes = table[2:5]
    assert nodes[0].split(" | ")[0].endswith("(head)")
    for row in nodes:
        cells = row.strip("| ").split(" | ")
        assert cells[1] == "CPU" and "(2 gloo ranks, 4 MiB)" in cells[2], row
        assert re.fullmatch(r"[\d,.]+ / [\d,.]+ MB/s", cells[3]), row
        assert cells[4].startswith("ok (") and cells[5].startswith("ok ("), row
        assert cells[6] == "none to build (cpu)", row     # no op built: deepspeed_import
    step = nodes[0].strip("| ").split(" | ")[7]
    assert step.startswith("uniter-tiny, 208 units, fp32: ") and "MFU n/a (CPU" in step
    assert all("(same type)" in row for row in nodes[1:])
    assert "(3 gloo ranks, 4 MiB)" in table[5] and table[5].startswith("| between nodes (3)")
    assert "vlp doctor: every check passed" in out and "FAIL" not in out
    assert not [p for p in s3_files(s3, "runs") if "/.vlp-doctor/" in p]


def test_a_lost_worker_node_resumes_from_s3_and_ends_at_the_configured_step(
        killed_job, s3, mlflow_server, cluster):
    out = killed_job["out"]
    print(f"killed {killed_job['killed']} at {killed_job['killed_at_s']:.0f} s; job took "
          f"{killed_job['duration_s']:.0f} s")
    resumed = [int(s) for s in re.findall(r"resumed from step (\d+)", out)]
    # rank 0's interconnect line at each start (2 workers: on two nodes, or one after the
    # kill); no instance type here, so no expected figure
    assert re.search(r"\[vlp pretrain\] interconnect (between nodes|within a node): all-reduce "
                     r"of 4 MiB over 2 ranks \(gloo\) in [\d.]+ ms: bus bandwidth [\d.]+ GB/s; "
                     r"expected: unknown", out), out[-4000:]
    assert resumed and resumed[0] >= INTERVAL and resumed[0] % INTERVAL == 0, out[-4000:]
    assert f"final_step {STEPS}" in out and "completed True" in out
    assert f"checkpoint s3://{BUCKET}/runs/{RUN}/checkpoint_step{STEPS:08d}" in out
    assert killed_job["killed"] not in cluster.raylets()        # the node is gone

    files = s3_files(s3, "")
    ckpts = {p.split("/")[3] for p in files
             if p.startswith(f"{BUCKET}/runs/{RUN}/checkpoint_step")}
    assert f"checkpoint_step{STEPS:08d}" in ckpts and len(ckpts) <= 2     # keep: 2
    assert any(p.startswith(f"{BUCKET}/mlartifacts/") and p.endswith("loss_curve.png")
               for p in files)

    client, runs = mlflow_runs(mlflow_server, RUN)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = sorted({m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")})
    assert steps == list(range(1, STEPS + 1))
    assert runs[0].data.tags["vlp.checkpoint_step"] == str(STEPS)
    assert runs[0].data.params["data.sources.coco.path"] == f"s3://{BUCKET}/{SHARDS}/coco"
    assert not [p for p in files if p.endswith("tracking-undelivered.jsonl")]

    # nothing of the run under the job's working folder on the head
    pkgs = list(cluster.temp.glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*"))
    assert pkgs
    for pkg in pkgs:
        assert not (pkg / "runs").exists() and not list(pkg.rglob("mlflow.db")), pkg


def test_resubmitting_after_a_code_edit_finds_the_run_instead_of_restarting(
        killed_job, cluster, mlflow_server, workdir, tmp_path):
    """The same job submitted again after a code edit (a new _ray_pkg_<hash> working folder)
    must find its run, not start a new one: the run storage and the MLflow run key come
    from the nodes' environment and the run name, never the job's working folder. The run
    has ended at its last step, so the driver says so in one line, naming the S3 checkpoint
    and the MLflow run it found by key, and exits 0 without starting Ray Train workers; the
    run in MLflow is left as it was."""
    before = set(cluster.temp.glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*"))
    with open(workdir / "jobs" / "pretrain.py", "a") as f:
        f.write("# edited after the first submission\n")
    job_id = f"vlp-mn-again-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    proc = cluster.submit(workdir, job_id, pretrain_entry(), {"VLP_DEBUG": "1"},
                          tmp_path / "again.log")
    out = finish(proc, tmp_path / "again.log", cluster, job_id)
    print(f"resubmitted job took {time.monotonic() - t0:.0f} s")
    after = set(cluster.temp.glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*"))
    assert after - before, "the edit did not give the job a new working folder"
    client, runs = mlflow_runs(mlflow_server, RUN)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert (f"[vlp pretrain] run {RUN} already finished: step {STEPS} of {STEPS}, checkpoint "
            f"s3://{BUCKET}/runs/{RUN}/checkpoint_step{STEPS:08d}, MLflow run "
            f"{runs[0].info.run_id}; nothing to train") in out, out[-4000:]
    assert "resumed from step" not in out and "final_step" not in out   # no worker started
    steps = sorted({m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")})
    assert steps == list(range(1, STEPS + 1))


def test_a_finetune_reads_the_s3_checkpoint_and_world(killed_job, cluster, mlflow_server,
                                                      workdir, tmp_path):
    job_id = f"vlp-mn-ft-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    proc = cluster.submit(workdir, job_id, [
        "jobs/finetune.py", "--checkpoint", f"s3://{BUCKET}/runs/{RUN}", "--world",
        WORLD, "--benchmarks", "retrieval", "--workers", "1", "--name", "mn-ft",
        "--set", "settings.retrieval.steps=2"], job_env(mlflow_server), tmp_path / "ft.log")
    out = finish(proc, tmp_path / "ft.log", cluster, job_id)
    print(f"finetune job took {time.monotonic() - t0:.0f} s")
    assert re.search(r"retrieval\.\w+ \d", out), out[-3000:]
    client, runs = mlflow_runs(mlflow_server, RUN)
    children = client.search_runs(
        [runs[0].info.experiment_id], f"tags.`mlflow.parentRunId` = '{runs[0].info.run_id}'")
    ft = [c for c in children if c.info.run_name == "mn-ft-retrieval"]
    assert ft and ft[0].data.params["finetune.checkpoint"] == f"s3://{BUCKET}/runs/{RUN}"
    assert ft[0].data.params["finetune.checkpoint_step"] == str(STEPS)


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


def test_mlflow_ui_shows_the_leaderboard(restored_sweep, chromium, tmp_path):
    """The MLflow UI as a user opens it from `vlp ui`'s leaderboard link: the view the sweep
    saved on its experiment (MLflow's "share view" state: an experiment tag named in the
    URL) shows its trials under a Meta-Sum column, best first. The screenshot is copied to
    runs/e2e/mlflow-ui.png, for a human to look at."""
    from mlflow.tracking import MlflowClient

    from vlp.platform.tracking.leaderboard_view import META_SUM_COLUMN, leaderboard_url

    uri = restored_sweep["uri"]
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

    # one browser start for both: the page's DOM (stdout) and its screenshot, taken after
    # the same virtual-time budget (two starts cost ~twice the seconds on a loaded machine)
    dom = subprocess.run([chromium, *flags, f"--user-data-dir={tmp_path / 'profile'}",
                          "--dump-dom", f"--screenshot={png}", url], capture_output=True,
                         text=True, timeout=300)
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
    assert png.is_file(), dom.stderr[-3000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    SCREENSHOT_COPY.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(png, SCREENSHOT_COPY)


@pytest.mark.skipif(not os.environ.get("VLP_ALL_GPU_CONFIGS"),
                    reason="~6 min: set VLP_ALL_GPU_CONFIGS=1 (make test runs one config, "
                           "uniter-base-indomain, as the killed job)")
def test_each_shipped_gpu_config_lands_its_run_in_the_bucket_and_the_tracking_server(
        cluster, s3, mlflow_server, workdir, tmp_path):
    """Each shipped GPU pretraining config, submitted as it stands (size overrides only),
    with nothing but the environment cluster.yaml gives every node: the checkpoints land in
    s3://$VLP_BUCKET/runs and the run on the head's MLflow server, not on a node."""
    configs = shipped_gpu_pretrain_configs()
    assert len(configs) >= 5, configs
    script = ["set -e"]
    for path in configs:
        raw = yaml.safe_load(path.read_text())
        sets = " ".join(f"--set '{s}'" for s in size_overrides(raw))
        script.append(f"python jobs/pretrain.py --config jobs/configs/{path.name} {sets}")
    job_id = f"vlp-mn-gpu-configs-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    proc = cluster.submit(workdir, job_id, ["-c", "\n".join(script)], {"VLP_DEBUG": "1"},
                          tmp_path / "configs.log", program="bash")
    out = finish(proc, tmp_path / "configs.log", cluster, job_id)
    print(f"{len(configs)} shipped configs in one job: {time.monotonic() - t0:.0f} s")
    files = s3_files(s3, "runs")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    for path in configs:
        raw = yaml.safe_load(path.read_text())
        name = raw["run"]["name"]
        steps = 2 * len(raw.get("stages") or [None])
        final = f"{BUCKET}/runs/{name}/checkpoint_step{steps:08d}/"
        assert any(p.startswith(final) for p in files), (name, sorted(files)[:20], out[-3000:])
        exp = client.get_experiment_by_name((raw.get("mlflow") or {}).get("experiment")
                                            or "vlp-pretrain")
        runs = client.search_runs([exp.experiment_id], f"attributes.run_name = '{name}'")
        assert len(runs) == 1 and runs[0].info.status == "FINISHED", (name, runs)
    pkgs = list(cluster.temp.glob("session_*/runtime_resources/working_dir_files/_ray_pkg_*"))
    for pkg in pkgs:    # nothing of any run in a job's working folder on the head
        assert not (pkg / "runs").exists() and not list(pkg.rglob("mlflow.db")), pkg
