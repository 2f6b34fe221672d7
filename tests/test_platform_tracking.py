"""MLflow tracking: embedded store, reachability check, runs by id/key, nested runs, plots;
and the driver refusing to start when the tracking server is unreachable."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import pytest

from vlp.platform.pretrain.experiment_config import load_experiment_config
from vlp.platform.tracking.mlflow_run import (PARENT_TAG, RUN_KEY_TAG, MlflowRun,
                                              TrackingUnreachable, check_reachable,
                                              embedded_artifact_location, embedded_tracking_uri,
                                              loss_curve_figure, run_key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_embedded_store_paths_are_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = embedded_tracking_uri("runs")
    assert uri == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}" and uri.startswith("sqlite:////")
    assert embedded_artifact_location("runs") == (tmp_path / "runs" / "mlartifacts").as_uri()
    check_reachable(uri)                     # creates the folder
    assert (tmp_path / "runs").is_dir()


def test_unreachable_server_is_a_clear_fast_error_without_the_password():
    uri = f"http://bob:pa55@127.0.0.1:{free_port()}"
    t0 = time.perf_counter()
    with pytest.raises(TrackingUnreachable) as e:
        check_reachable(uri, timeout_s=1.0)
    assert time.perf_counter() - t0 < 5
    msg = str(e.value)
    assert "unreachable" in msg and f"127.0.0.1:{uri.rsplit(':', 1)[1]}" in msg
    assert "pa55" not in msg and "bob:***@" in msg


def test_relative_sqlite_and_file_stores_are_refused():
    with pytest.raises(TrackingUnreachable, match="relative"):
        check_reachable("sqlite:///mlflow.db")
    with pytest.raises(TrackingUnreachable, match="file stores"):
        check_reachable("file:///tmp/mlruns")


@pytest.mark.parametrize("health_status", [200, 500, 404])
def test_the_health_check_passes_only_on_200_from_health(health_status):
    """A server answering 200 on /health passes; one answering 500 (up but broken) or 404 (no
    /health: not an MLflow server) is refused with the status named."""
    asked = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(health_status if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_port}"
    try:
        if health_status == 200:
            check_reachable(uri, timeout_s=2)
        else:
            with pytest.raises(TrackingUnreachable, match=f"answered /health with HTTP "
                                                          f"{health_status}"):
                check_reachable(uri, timeout_s=2)
    finally:
        server.shutdown()
    assert asked == ["/health"]


def test_runs_by_key_nested_runs_params_metrics_artifacts(tmp_path):
    uri = embedded_tracking_uri(tmp_path)
    art = embedded_artifact_location(tmp_path)
    key = run_key(str(tmp_path), "job")
    run = MlflowRun.open(uri, "exp", run_name="job", key=key, artifact_location=art)
    assert run.log_params({"a": "1", "b": "x"}) == []
    run.log_metric_rows([(1, {"loss": 2.0}), (2, {"loss": 1.5})])
    # a restarted worker finds the same run by key; changed params are listed, not re-logged
    again = MlflowRun.open(uri, "exp", run_name="job", key=key)
    assert again.run_id == run.run_id
    assert again.log_params({"a": "1", "b": "y", "c": "3"}) == ["b"]
    again.log_metric_rows([(2, {"loss": 1.5}), (3, {"loss": 1.0})])  # step 2 re-run
    assert again.metric_history("loss") == [(1, 2.0), (2, 1.5), (3, 1.0)]
    again.log_figure(loss_curve_figure({"loss": again.metric_history("loss")}), "plots/l.png")
    again.log_text("x: 1\n", "config/x.yaml")
    again.finish()

    child = again.child("finetune-vqa")
    grandchild = MlflowRun.open(uri, "exp", run_name="seed-0", parent_run_id=child.run_id)
    client = run.client
    r = client.get_run(run.run_id)
    assert r.data.params == {"a": "1", "b": "x", "c": "3"}
    assert r.data.tags[RUN_KEY_TAG] == key and r.data.tags["vlp.changed_on_resume"] == "b"
    assert r.info.status == "FINISHED"
    assert client.get_run(child.run_id).data.tags[PARENT_TAG] == run.run_id
    assert client.get_run(grandchild.run_id).data.tags[PARENT_TAG] == child.run_id
    paths = {a.path for d in ("plots", "config") for a in client.list_artifacts(run.run_id, d)}
    assert paths == {"plots/l.png", "config/x.yaml"}
    assert str(tmp_path / "mlartifacts") in r.info.artifact_uri
    assert len(client.search_runs([run.experiment_id])) == 3


def test_driver_refuses_to_start_when_the_tracking_server_is_unreachable(tmp_path):
    from vlp.platform.pretrain.run import run_pretraining
    from vlp.testing.toy import ToyComponents

    cfg = load_experiment_config(data={
        "run": {"name": "unreachable", "output_dir": str(tmp_path)},
        "data": {"sources": {"a": {"path": "/x"}}}, "tasks": {"mlm": 1},
        "train": {"steps": 5}, "optimizer": {"warmup_steps": 1},
        "mlflow": {"tracking_uri": f"http://127.0.0.1:{free_port()}", "check_timeout_s": 1}})
    t0 = time.perf_counter()
    with pytest.raises(TrackingUnreachable, match="MLflow tracking server .* is unreachable"):
        run_pretraining(cfg, ToyComponents())
    assert time.perf_counter() - t0 < 10
    assert not (tmp_path / "unreachable").exists()      # no training was started
