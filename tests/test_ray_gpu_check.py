"""The GPU check's Ray part (jobs/benchmarks/ray_gpu_check.py, vlp/platform/gpu_check/
ray_paths.py) on a CPU: its refusal in one
line, its plan, and every command it would run passing that command's own --check."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "jobs" / "benchmarks"))
import ray_gpu_check  # noqa: E402
from vlp.platform.gpu_check import ray_paths  # noqa: E402


def test_without_cuda_it_says_so_in_one_line_and_exits_0():
    proc = subprocess.run([sys.executable, str(ROOT / "jobs" / "benchmarks" / "ray_gpu_check.py")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ray-gpu-check: no CUDA device"), lines


def test_the_plan_stops_and_resumes_one_run_and_times_the_local_runner_on_the_same_config(tmp_path):
    plan = ray_paths.Plan(tmp_path, steps=40, images=10, extract_images=8)
    runs = dict(plan.runs())
    assert list(runs) == ["ray_full", "ray_stopped", "ray_resumed", "local"]
    sets = {name: [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
            for name, argv in runs.items()}
    assert "train.stop_after=20" in sets["ray_stopped"]
    assert "run.name=ray-resume" in sets["ray_stopped"] and "run.name=ray-resume" in sets[
        "ray_resumed"]
    assert "--local" in runs["local"] and "--local" not in runs["ray_full"]
    for name in runs:        # the same config but for the run's name and the stop
        assert "scaling.use_gpu=true" in sets[name]
        same = [s for s in sets[name] if not s.startswith(("run.name", "train.stop_after"))]
        assert same == [s for s in sets["ray_full"] if not s.startswith("run.name")]
    extract = plan.extract_argv(tmp_path / "jpegs")
    assert extract[:2] == ["data", "extract"]
    for flag, value in (("--model", "butd-r101-c4"), ("--gpus", "1"), ("--short-side", "600"),
                        ("--long-side", "1000")):
        assert extract[extract.index(flag) + 1] == value


def test_the_extraction_runs_where_the_plan_runs(tmp_path):
    """BUTD's settings on the GPU, the small extractor for a rehearsal, and CPU actors
    whenever the plan runs on a CPU, quick or not."""
    def gpus(**kw):
        argv = ray_paths.Plan(tmp_path, steps=8, images=10, extract_images=8, **kw).extract
        return argv[argv.index("--model") + 1], argv[argv.index("--gpus") + 1]

    assert gpus() == ("butd-r101-c4", "1")
    assert gpus(gpu=False) == ("butd-r101-c4", "0")
    assert gpus(gpu=False, quick=True) == ("grid-r50", "0")
    assert gpus(quick=True) == ("grid-r50", "1")


def test_tracking_is_off_in_one_line_where_mlflow_is_not_installed(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    sets, line = ray_paths.tracking(tmp_path)
    assert sets == ["mlflow.enabled=false"] and line.startswith("tracking: off")
    monkeypatch.setattr(importlib.util, "find_spec", real)
    sets, line = ray_paths.tracking(tmp_path)
    assert sets == [f"mlflow.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]


def test_every_command_of_the_plan_passes_its_own_check(capsys):
    assert ray_gpu_check.main(["--check"]) == 0
    out = capsys.readouterr().out
    for name in ("ray_full", "ray_stopped", "ray_resumed", "local", "extract"):
        assert f"check {name}: vlp " in out and out.count(f"check {name}:") == 1
    assert out.count("--check: ok") == 5


def test_each_part_is_reported_as_it_ends_and_a_failed_part_does_not_stop_the_next(
        tmp_path, monkeypatch):
    """On a GPU the parts' figures are printed and the JSON rewritten after each part (a call
    cut off at its time limit keeps what ended); a part that raises is recorded under
    ``errors`` and the next one still runs; the cluster is stopped either way. The parts
    themselves stand in here (they need a GPU)."""
    import ray
    import torch

    stopped = []
    # not this test process's Ray (the session's, shared with the tests after this one)
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append(["ray.shutdown"]))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Stand-in GPU")
    monkeypatch.setattr(ray_paths, "write_world", lambda plan: None)
    monkeypatch.setattr(ray_paths, "start_cluster", lambda work, gpus: ("127.0.0.1:1", {}))
    monkeypatch.setattr(ray_paths.subprocess, "run", lambda argv, **kw: stopped.append(argv))

    def pretrain(plan, address, start_ray):
        raise RuntimeError("NCCL error: unhandled system error")

    monkeypatch.setattr(ray_paths, "pretrain_part", pretrain)
    monkeypatch.setattr(ray_paths, "extract_part", lambda plan, env: {"extract.job": 25.0})
    reports = []
    plan = ray_paths.Plan(tmp_path, steps=40, images=10, extract_images=8)
    figures = ray_paths.run_on_gpu(plan, lambda all_, new: reports.append(dict(new)),
                                  start_ray=None)
    assert reports == [{"device": "Stand-in GPU"}, {}, {"extract.job": 25.0}]
    assert figures["errors"] == {"pretrain": "RuntimeError: NCCL error: unhandled system error"}
    assert figures["extract.job"] == 25.0
    assert stopped[0] == ["ray.shutdown"] and stopped[-1][-1] == "stop"


def _history(losses: dict[int, float]) -> dict[int, dict]:
    return {s: {"step": s, "loss": v} for s, v in losses.items()}


def test_a_resume_is_judged_against_the_drift_of_two_runs_without_one():
    """Bit-equal losses after the stop pass; on a device whose kernels add with atomics, a
    resumed run may differ in the last bits, and passes when it differs no more than twice
    what two runs with no resume do (the stopped run before its stop against the
    uninterrupted one); a resume that lost state (a jump far above that drift) or steps that
    are missing fails."""
    full = {s: 5.0 - 0.05 * s for s in range(1, 41)}
    exact = {s: full[s] for s in range(1, 21)}
    same = ray_paths.resume_figures(
        {"ray_full": _history(full), "ray_stopped": _history(exact),
         "ray_resumed": _history({s: full[s] for s in range(21, 41)})}, 20)
    assert same["resume.all_after_equal"] and same["resume.within_run_to_run_drift"]
    assert same["resume.steps_compared"] == 20 and same["resume.max_rel_diff_after"] == 0.0
    assert same["resume.run_to_run_max_rel_diff"] == 0.0

    noisy = {s: full[s] * (1 + 1e-4) if s > 1 else full[s] for s in range(1, 21)}
    jitter = {s: full[s] * (1 - 5e-5) for s in range(21, 41)}
    drifted = ray_paths.resume_figures(
        {"ray_full": _history(full), "ray_stopped": _history(noisy),
         "ray_resumed": _history(jitter)}, 20)
    assert not drifted["resume.all_after_equal"]
    assert drifted["resume.within_run_to_run_drift"]
    assert abs(drifted["resume.run_to_run_max_rel_diff"] - 1e-4) < 1e-9

    lost = {s: full[s] * 1.02 for s in range(21, 41)}          # e.g. the optimizer state lost
    broken = ray_paths.resume_figures(
        {"ray_full": _history(full), "ray_stopped": _history(noisy),
         "ray_resumed": _history(lost)}, 20)
    assert not broken["resume.within_run_to_run_drift"]
    assert abs(broken["resume.max_rel_diff_after"] - 0.02) < 1e-9
    # exact where the device is exact: any difference after the stop fails
    tiny = ray_paths.resume_figures(
        {"ray_full": _history(full), "ray_stopped": _history(exact),
         "ray_resumed": _history(jitter)}, 20)
    assert not tiny["resume.within_run_to_run_drift"]

    # drift that grows with the steps: judged on the first two steps after the stop (as far
    # from the start as the drift's last steps), the later ones reported only
    growing = {s: full[s] * (1 + 5e-5 * (s - 20)) for s in range(21, 41)}
    grown = ray_paths.resume_figures(
        {"ray_full": _history(full), "ray_stopped": _history(noisy),
         "ray_resumed": _history(growing)}, 20)
    assert grown["resume.within_run_to_run_drift"]
    assert grown["resume.max_rel_diff_after"] > 2 * grown["resume.run_to_run_max_rel_diff"]
    # the moments lost: the step after the stop is right, the one after it is not
    moments = {s: full[s] * (1.0 if s == 21 else 1.01) for s in range(21, 41)}
    assert not ray_paths.resume_figures(
        {"ray_full": _history(full), "ray_stopped": _history(noisy),
         "ray_resumed": _history(moments)}, 20)["resume.within_run_to_run_drift"]

    short = ray_paths.resume_figures(
        {"ray_full": _history(full), "ray_stopped": _history(exact),
         "ray_resumed": _history({s: full[s] for s in range(21, 30)})}, 20)
    assert not short["resume.all_after_equal"] and not short["resume.within_run_to_run_drift"]


def test_ray_and_the_local_runner_are_compared_per_input_unit():
    """The two runs train the same data in other orders: their batches differ in input
    units, so the median step's seconds per input unit is what is compared (after the
    warm-up steps)."""
    def history(times_units):
        return {step: {"step": step, "step_time_s": t, "global_batch_input_units": units}
                for step, (t, units) in enumerate(times_units, 1)}

    slow_start = [(9.0, 100)] * 5
    ray = history(slow_start + [(1.0, 100), (2.0, 200), (1.5, 100)])
    assert ray_paths.seconds_per_unit(ray, 5) == 0.01
    assert ray_paths.seconds_per_unit(history(slow_start + [(3.0, 100)] * 3), 5) == 0.03


def test_the_data_wait_share_is_over_the_steps_after_the_warm_up():
    history = {1: {"step_time_s": 10.0, "data_wait_s": 9.0},
               2: {"step_time_s": 1.0, "data_wait_s": 0.5},
               3: {"step_time_s": 3.0, "data_wait_s": 0.0}}
    assert ray_paths.data_wait_share(history, 1) == 0.5 / 4.0
    assert ray_paths.data_wait_share(history, 3) == 0.0

