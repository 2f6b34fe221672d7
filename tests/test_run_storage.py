"""Where runs live (vlp.platform.cluster.run_storage): a local folder or a URI, resolved in one
place,
found again by storage root + run name, refused on a multi-node cluster when other nodes
cannot reach it; and the finetune reader taking a checkpoint from S3 (moto's server)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from vlp.platform.cluster import job_nodes, run_storage
from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.pretrain.run import check_cluster, preflight, resolve, tracking_spec
from vlp.platform.tracking.mlflow_run import TrackingUnreachable, run_key
from vlp.platform.tracking.choice import check_tracking_shared, choose_tracking_uri


def config(**run):
    return load_experiment_config(data={"run": {"name": "job", **run}, "train": {"steps": 4},
                                        "optimizer": {"warmup_steps": 1},
                                        "data": {"sources": {"a": {"path": "a"}}}})


@pytest.fixture
def no_env(monkeypatch):
    for k in ("VLP_STORAGE", "MLFLOW_TRACKING_URI", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_a_uri_stays_a_uri_and_names_the_run(no_env):
    no_env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    cfg = resolve(config(storage="s3://bucket/vlp/"))
    assert cfg.run.storage == "s3://bucket/vlp"          # not <cwd>/s3:/bucket/vlp
    spec = tracking_spec(cfg)
    assert spec["key"] == run_key("s3://bucket/vlp", "job")
    assert spec["storage"] == "s3://bucket/vlp"
    storage = run_storage.open_location(cfg.run.storage)
    kwargs = storage.ray_storage()
    assert kwargs["storage_path"] == "bucket/vlp"
    assert type(kwargs["storage_filesystem"]).__name__ == "S3FileSystem"
    assert storage.uri("job", "checkpoint_2") == "s3://bucket/vlp/job/checkpoint_2"


def test_vlp_storage_finds_the_run_again_from_any_working_folder(no_env, tmp_path):
    """A resubmitted job runs in a new _ray_pkg_<hash> folder: the run (Ray's resume and
    the MLflow run key) must not depend on it."""
    shared = tmp_path / "shared"
    no_env.setenv("VLP_STORAGE", str(shared))
    keys, roots = [], []
    for pkg in ("_ray_pkg_aaaa", "_ray_pkg_bbbb"):
        (tmp_path / pkg).mkdir()
        no_env.chdir(tmp_path / pkg)
        cfg = resolve(config())                       # run.output_dir "runs" (relative)
        keys.append(tracking_spec(cfg)["key"])
        roots.append(cfg.run.storage)
    assert roots == [str(shared), str(shared)] and keys[0] == keys[1]
    assert resolve(config(storage=str(tmp_path / "mine"))).run.storage == str(tmp_path / "mine")


def test_resume_discovery_reads_the_newest_checkpoint_through_the_storage(no_env, tmp_path):
    storage = run_storage.open_location(str(tmp_path))
    for step in (2, 10, 4):
        storage.write_text(json.dumps({"step": step, "stage": 0, "tag": f"s{step}",
                                       "stages": [["pretrain", 4]], "world_size": 2}),
                           "job", f"checkpoint_step{step:08d}", "vlp_trainer.json")
    storage.fs.create_dir(storage.fs_path("job", "checkpoint_step00000099"))  # unfinished
    meta = storage.latest_checkpoint_meta("job")
    assert meta["step"] == 10 and meta["uri"] == f"{tmp_path}/job/checkpoint_step00000010"
    assert storage.latest_checkpoint_meta("other") is None
    # the preflight sees it: step 10 does not fit a 4-step run
    cfg = resolve(config(storage=str(tmp_path)))
    with pytest.raises(ValueError, match="step 10"):
        mlflow = cfg.mlflow.model_copy(update=dict(enabled=False))
        preflight(cfg.model_copy(update=dict(mlflow=mlflow)))


def test_a_run_at_its_last_step_is_reported_instead_of_resumed(no_env, tmp_path):
    """`vlp pretrain` on a run that has ended says so (checkpoint, MLflow run) and starts
    nothing; a run short of its last step, or whose checkpoint does not fit, is not ended."""
    from vlp.platform.pretrain.job import finished_run

    storage = run_storage.open_location(str(tmp_path))

    def checkpoint(step, stages=(("pretrain", 4),)):
        storage.write_text(json.dumps({"step": step, "stage": 0, "stages": stages,
                                       "world_size": 2, "zero_stage": 0}),
                           "job", f"checkpoint_step{step:08d}", "vlp_trainer.json")

    def cfg(steps):
        return load_experiment_config(data={
            "run": {"name": "job", "storage": str(tmp_path)}, "train": {"steps": steps},
            "optimizer": {"warmup_steps": 1}, "mlflow": {"enabled": False},
            "data": {"sources": {"a": {"path": "a"}}}})

    checkpoint(2)
    assert finished_run(cfg(4)) is None                       # step 2 of 4: resume it
    checkpoint(4)
    assert finished_run(cfg(4)) == (
        f"run job already finished: step 4 of 4, checkpoint {tmp_path}/job/checkpoint_step"
        f"00000004, MLflow run off; nothing to train (a new run.name starts a new run)")
    assert finished_run(cfg(6)) is None                       # lengthened: it goes on
    assert finished_run(cfg(3)) is None                       # does not fit: preflight's


def test_multi_node_refuses_storage_other_nodes_cannot_read(no_env, tmp_path):
    work = tmp_path / "_ray_pkg_abc"
    work.mkdir()
    no_env.chdir(work)
    for given, why in (("runs", "a relative path"), ("../elsewhere", "a relative path"),
                       (str(work / "runs"), "inside the job's")):
        with pytest.raises(run_storage.StorageError, match=why) as e:
            run_storage.check_shared(run_storage.open_location(given), nodes=3)
        msg = str(e.value)
        assert "\n" not in msg and "VLP_STORAGE=s3://" in msg and "run.storage" in msg
        run_storage.check_shared(run_storage.open_location(given), nodes=1)   # one node: fine
    run_storage.check_shared(run_storage.open_location(str(tmp_path / "nfs")), nodes=3)
    no_env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    run_storage.check_shared(run_storage.open_location("s3://b/vlp"), nodes=3)


HEAD_ONLY = [{"NodeID": "head", "Alive": True, "Resources": {"CPU": 0.0, "memory": 1e10}},
             {"NodeID": "gone", "Alive": False, "Resources": {"CPU": 8.0, "GPU": 4.0}}]


def test_a_job_spans_nodes_when_this_node_cannot_hold_its_workers():
    """An autoscaling cluster at submit time: only the head is alive, and it holds no
    training work (cluster.yaml: CPU 0). Counting live nodes says 1; the job's workers will
    run on nodes the autoscaler starts."""
    gpu = job_nodes.worker_resources(4, True, "A10G")
    assert gpu == {"CPU": 4.0, "GPU": 1.0, "accelerator_type:A10G": 0.001}
    span = job_nodes.job_span(8, gpu, nodes=HEAD_ONLY, here="head")
    assert span.nodes > 1 and "CPU 0" in span.why and "GPU" in span.why
    # a laptop's local Ray that holds every worker: one node
    laptop = [{"NodeID": "me", "Alive": True, "Resources": {"CPU": 8.0}}]
    assert job_nodes.job_span(2, job_nodes.worker_resources(2, False), nodes=laptop,
                              here="me").nodes == 1
    assert job_nodes.job_span(5, job_nodes.worker_resources(2, False), nodes=laptop,
                              here="me").nodes == 2
    # several live nodes: they count as before
    assert job_nodes.job_span(1, {"CPU": 1}, nodes=laptop * 3, here="me").nodes == 3


def test_the_refusal_comes_after_ray_is_attached_and_counts_the_workers(no_env, tmp_path):
    """resolve (before Ray) no longer decides; check_cluster (Ray attached, before any
    worker) refuses the node-local default for a job whose workers run elsewhere, in one line
    naming VLP_STORAGE; the MLflow file store too."""
    no_env.chdir(tmp_path)
    cfg = resolve(config())                      # output_dir "runs", no VLP_STORAGE
    no_env.setattr(job_nodes, "job_span", lambda workers, per_worker: job_nodes.JobSpan(
        2, "this node (CPU 0) cannot hold the 2 worker(s)' CPU"))
    with pytest.raises(run_storage.StorageError, match="relative path") as e:
        check_cluster(cfg, "runs")
    assert "\n" not in str(e.value) and "VLP_STORAGE=s3://" in str(e.value)
    assert "cannot hold the 2 worker(s)" in str(e.value)
    with pytest.raises(run_storage.StorageError, match="inside the job's working folder"):
        check_cluster(cfg)                       # the resolved path alone
    shared = resolve(config(storage=str(tmp_path.parent / "nfs")))
    with pytest.raises(TrackingUnreachable, match="MLFLOW_TRACKING_URI=http"):
        check_cluster(shared)                    # the sqlite default: on one node
    check_cluster(shared.model_copy(update=dict(mlflow=shared.mlflow.model_copy(
        update=dict(tracking_uri="http://head:5000")))))
    no_env.setattr(job_nodes, "job_span", lambda workers, per_worker: job_nodes.JobSpan(
        1, "every worker fits on this node"))
    check_cluster(cfg, "runs")                   # one node: the local default is fine


def test_a_real_local_ray_holding_the_workers_is_one_node(ray_local):
    assert job_nodes.job_span(1, job_nodes.worker_resources(1, False)).nodes == 1
    span = job_nodes.job_span(64, job_nodes.worker_resources(1, False))
    assert span.nodes == 2 and "cannot hold the 64 worker(s)' CPU" in span.why
    span = job_nodes.job_span(1, job_nodes.worker_resources(1, True))
    assert span.nodes == 2 and "GPU 0" in span.why


def test_credentials_in_a_storage_uri_are_refused():
    with pytest.raises(run_storage.StorageError, match="AWS_ACCESS_KEY_ID") as e:
        run_storage.open_location("s3://AKIA:s3cr3t@bucket/vlp")
    assert "s3cr3t" not in str(e.value)


def test_tracking_follows_config_then_env_then_embedded_and_is_shared_on_clusters(no_env,
                                                                                  tmp_path):
    assert choose_tracking_uri("http://cfg:5000", tmp_path) == "http://cfg:5000"
    no_env.setenv("MLFLOW_TRACKING_URI", "http://env:5000")
    assert choose_tracking_uri("", tmp_path) == "http://env:5000"
    assert resolve(config()).mlflow.tracking_uri == "http://env:5000"
    no_env.delenv("MLFLOW_TRACKING_URI")
    assert choose_tracking_uri("", tmp_path).startswith("sqlite:////")
    for uri in ("sqlite:////x/mlflow.db", "file:///x/mlruns", "/x/mlruns"):
        with pytest.raises(TrackingUnreachable, match="MLFLOW_TRACKING_URI=http"):
            check_tracking_shared(uri, nodes=2)
        check_tracking_shared(uri, nodes=1)
    check_tracking_shared("http://head:5000", nodes=5)


def test_finetune_reads_a_pretraining_checkpoint_from_s3(s3_env, tmp_path):
    """The checkpoint folder, or its run folder (newest checkpoint), by URI: only the trainer
    meta and the model states are fetched, into a cache keyed by the URI."""
    from test_finetune_tracking import fake_pretraining_checkpoint

    from vlp.platform.training import pretrained_weights as ckpt

    bucket = s3_env.create_bucket("ft-read")
    model, folder = fake_pretraining_checkpoint(tmp_path / "local")
    storage = run_storage.open_location(f"{bucket}/vlp")
    for f in folder.rglob("*"):
        if f.is_file():
            with storage.fs.open_output_stream(storage.fs_path(
                    "pre", folder.name, str(f.relative_to(folder)))) as out:
                out.write(f.read_bytes())
    storage.write_text("{}", "pre", folder.name, "unused.bin")
    for uri in (f"{bucket}/vlp/pre/{folder.name}", f"{bucket}/vlp/pre"):
        weights = ckpt.read(uri)
        assert weights.step == 7
        torch.testing.assert_close(weights.state["backbone.text_embeddings.word_embeddings.weight"],
                                   model.state_dict()["backbone.text_embeddings.word_embeddings."
                                                      "weight"])
    cached = {p.name for p in (tmp_path / "cache").rglob("*") if p.is_file()}
    assert cached == {"vlp_trainer.json", "mp_rank_00_model_states.pt"}
    with pytest.raises(Exception, match="no such checkpoint"):
        ckpt.read(f"{bucket}/vlp/missing")
    assert not os.environ.get("VLP_STORAGE")
