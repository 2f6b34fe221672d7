"""Quiet console: Ray's worker output goes through Ray's stdstream dispatcher; in quiet mode
the router in place of Ray's printer shows vlp's lines (without Ray's prefix) and the
raylet's, and writes every line to the run folder's log. No Ray cluster: the dispatcher is
fed the dicts Ray's log monitor sends."""

from __future__ import annotations

from pathlib import Path

import pytest

from vlp.platform.cluster import console


def batch(lines, pid=4242, actor="RayTrainWorker", is_err=False):
    return {"pid": pid, "actor_name": actor, "task_name": "", "lines": lines,
            "is_err": is_err, "ip": "127.0.0.1", "localhost": "127.0.0.1"}


@pytest.fixture
def dispatcher(monkeypatch):
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as d

    printed: list = []
    saved = list(d.handlers)
    d.handlers = [("ray_print_logs", printed.append)]       # Ray's printer, as ray.init adds it
    monkeypatch.setattr(console, "_state", {"quiet": False, "router": None, "path": None})
    yield d, printed
    d.handlers = saved


def test_quiet_shows_vlp_lines_and_logs_the_rest(dispatcher, tmp_path, capsys):
    d, ray_printed = dispatcher
    console.configure(quiet=True)
    assert console.apply() is True and console.apply() is True      # installed once
    assert [n for n, _ in d.handlers] == ["vlp_console"]
    d.emit(batch(["Reporting training result 1: TrainingReport(...)",
                  "[vlp pretrain] t001-pretrain step 50/300 (main) loss 4.1"],
                 actor="TrainController"))
    d.emit(batch(["[sweep] t001 stage 1/4: finetune + evaluate vqa",
                  "[2026-11-25] [INFO] [engine.py] DeepSpeed info: version=0.18"]))
    # the same worker line again on the other stream (Ray Train's print patch): shown once
    d.emit(batch(["[sweep] t001 stage 1/4: finetune + evaluate vqa"], is_err=True))
    d.emit(batch(["A worker died or was killed while executing a task"], pid="raylet"))
    d.emit(batch(["WARNING: 22 PYTHON worker processes have been started on node: 4fe9 with "
                  "address: 192.0.2.2, which is 11x the maximum expected startup concurrency"],
                 pid="raylet"))
    d.emit(batch(["======== Autoscaler status: 2026-11-25 14:21:21 ========"],
                 pid="autoscaler", actor=""))
    log = tmp_path / "sweep" / console.RAY_LOG
    assert console.log_to(log) == log        # lines before the path was known are kept
    d.emit(batch(["Checkpoint successfully created at: Checkpoint(...)"]))
    out = capsys.readouterr().out.splitlines()
    assert out == ["[vlp pretrain] t001-pretrain step 50/300 (main) loss 4.1",
                   "[sweep] t001 stage 1/4: finetune + evaluate vqa",
                   "A worker died or was killed while executing a task"]
    written = log.read_text().splitlines()
    assert len(written) == 8 and ray_printed == []          # not the autoscaler's table
    assert written[0] == ("(TrainController pid=4242) Reporting training result 1: "
                          "TrainingReport(...)")
    assert written[-1].startswith("(RayTrainWorker pid=4242) Checkpoint successfully")


def test_verbose_leaves_ray_printing(dispatcher, tmp_path):
    d, ray_printed = dispatcher
    console.configure(quiet=False)
    assert console.apply() is False and console.log_to(tmp_path / "x.log") is None
    d.emit(batch(["Reporting training result 1"]))
    assert len(ray_printed) == 1 and [n for n, _ in d.handlers] == ["ray_print_logs"]


def test_the_ray_log_of_a_job_on_shared_storage_stays_out_of_its_working_dir(tmp_path, monkeypatch):
    """Under ``ray job submit`` a relative output_dir resolves inside Ray's package folder:
    a job whose runs live at a URI writes its Ray log under the temp dir, a local one in its
    run storage."""
    import tempfile

    from vlp.platform.cluster.console import log_folder

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("VLP_STORAGE", raising=False)
    assert log_folder("s3://bucket/vlp", "runs") == Path(tempfile.gettempdir()) / "vlp-ray-logs"
    monkeypatch.setenv("VLP_STORAGE", "s3://bucket/vlp")
    assert not str(log_folder("", "runs")).startswith(str(tmp_path))
    monkeypatch.delenv("VLP_STORAGE")
    assert log_folder("", "runs") == tmp_path / "runs"
    assert log_folder(str(tmp_path / "st"), "runs") == tmp_path / "st"
