"""The GPU check's CPU side (jobs/benchmarks/gpu_check.py): without a GPU, `make gpu-check`'s
command says so in one line and exits 0; `--device cpu --quick` runs every part on the tiny
model through the local runner and writes the JSON the GPU run writes — in a process where
Ray, MLflow and Optuna cannot be imported (the GPU machine has none of them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from no_ray_imports import PRELUDE

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "jobs" / "benchmarks" / "gpu_check.py"

GUARDED = PRELUDE + textwrap.dedent("""
    import runpy, sys
    sys.argv = sys.argv[1:]
    sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0])
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def _run(*args, cwd):
    return subprocess.run([sys.executable, "-c", GUARDED, str(SCRIPT), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1"))


def test_without_a_gpu_one_line_and_exit_0(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = _run(cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().count("\n") == 0
    assert proc.stdout.startswith("gpu-check: no CUDA device")
    assert not (tmp_path / "gpu_check.json").exists()


def test_extract_section_times_mixed_sizes_against_one_size():
    """The extract section's figures at its quick sizes (butd-tiny; butd-r101-c4 at BUTD's
    600/1000 on a GPU): both folders timed, the passes alternated, the ratios consistent."""
    import torch

    from vlp.models.vision.extractors.base import ExtractSettings
    from vlp.platform.extract.model_rate import mixed_vs_uniform
    from vlp.platform.gpu_check.check import sizes

    assert sizes(False, True)["extract"]["model"] == "butd-r101-c4"
    e = sizes(True, False)["extract"]
    threads = torch.get_num_threads()
    f = mixed_vs_uniform(e["model"], ExtractSettings(short_side=e["short_side"],
                                                     long_side=e["long_side"]),
                         e["images"], e["batch"], threads, False, e["rounds"])
    assert torch.get_num_threads() == threads     # the check's setting left as it was
    assert f["model"] == "butd-tiny" and len(f["round_ratios"]) == f["rounds"] == 2
    assert f["uniform_images_per_s"] > 0 and f["mixed_images_per_s"] > 0
    assert f["ratio_mixed_over_uniform"] == pytest.approx(
        f["mixed_images_per_s"] / f["uniform_images_per_s"])
    # mixed aspects resize to other pixel counts than 480×640's 96×128
    assert f["uniform_mpixel_per_image"] == pytest.approx(96 * 128 / 1e6)
    assert f["mixed_mpixel_per_image"] != f["uniform_mpixel_per_image"]


@pytest.mark.integration
def test_quick_cpu_run_writes_every_figure(tmp_path):
    out = tmp_path / "check.json"
    proc = _run("--device", "cpu", "--quick", "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["errors"] == {}, result["errors"]
    # the shards it wrote for itself: real-job shapes (bench_sources.py), quick-sized
    assert result["world"]["images"] == 60 and result["world"]["feature_dim"] == 64
    steps = result["pretrain_uniter_tiny"]
    assert steps["real_units_share"] > 0.8   # rows of 20–120 units, bucketed by length
    assert steps["sweep"]["units_1024"]["steady_s_per_input_unit"] > 0, steps["sweep"]
    for key in ("step_time_s", "data_wait_share", "model_tflops_per_s",
                "model_tflops_per_s_real", "loop_overhead", "real_units_share"):
        assert steps[key] > 0 or key == "data_wait_share", key
    assert 0 < steps["real_units_share"] <= 1
    assert steps["loop_overhead_median_step"] > 0 and steps["slow_steps"] >= 0
    assert steps["cold"]["loop_overhead"] > 0 and steps["cold"]["step_time_s"] > 0
    # the run again with its batches built in the builder process
    other = steps["other_builder"]   # then on the thread again: the order's own drift
    assert steps["builder"] == "thread" and other["process"]["builder"] == "process", other
    assert other["thread_again"]["loop_overhead"] > 0 and other["process_over_thread"] > 0
    steady = steps["steady"]   # the diagnostics: second passes, cuDNN SDPA off/on
    for key in ("no_cudnn_sdpa_s_per_input_unit", "cudnn_sdpa_s_per_input_unit",
                "deepspeed_bookkeeping_s_per_input_unit", "flat_over_deepspeed_bookkeeping",
                "deepspeed_step_s_per_input_unit", "device_step_over_deepspeed_step",
                "separate_qkv_s_per_input_unit", "fused_over_separate_qkv",
                "beside_batcher_thread_over_alone", "beside_batcher_process_over_alone",
                "beside_batcher_process_batches_per_s", "order_drift",
                "varlen_attention_s_per_input_unit", "varlen_over_padded_attention"):
        assert steady[key] > 0, steady
    # the variants took turns, twice each (A B C A B C)
    assert len(steady["cudnn_sdpa_rounds"]) == steady["rounds"] == 2
    profile = steps["profile"]
    assert 0 < profile["busy_share"] <= 1 and profile["top"], profile
    ops = steps["host_ops"]   # aten ops per step by phase: the host's work in a step
    assert ops["forward_per_step"] > 0 and ops["step_per_step"] > 0, ops
    assert ops["per_step"] == pytest.approx(ops["forward_per_step"] + ops["backward_per_step"]
                                            + ops["step_per_step"])
    syncs = steps["host_syncs"]
    assert syncs["method"] == "recorder"
    assert syncs["forward_per_step"] == 0 and syncs["backward_per_step"] == 0
    assert syncs["optimizer_step_per_step"] == 0, syncs    # device_step.py
    precision = result["precision"]
    # no TF32 on a CPU; fp32 through ZeRO-1's flat optimizer trains as ZeRO-0's does
    assert set(precision["per_task_mean_loss"]) == {"bf16", "fp32", "fp32_zero1"}
    assert 0 <= precision["bf16_vs_fp32_max_rel_diff"] < 0.1
    assert precision["zero1_vs_zero0_fp32_max_rel_diff"] < 1e-4
    assert result["resume"]["next_step_loss_equal"] and result["resume"]["all_after_equal"]
    assert result["sdpa"]["default_kernel"] in ("math", "flash", "mem_efficient", "cudnn")
    assert result["sdpa"]["math_ms"] > 0
    # variable-length attention on the same rows: a CPU runs its segments as a dense mask
    assert result["sdpa"]["varlen_kernel"] == "dense_mask" and result["sdpa"]["varlen_ms"] > 0
    assert result["batcher"]["batcher_over_step_consumption"] > 0
    # the peer ratio: with the official UNITER code at hand (make gpu-wheels UNITER_REPO=...
    # or $UNITER_REPO; test_gpu_check_peer.py checks it), else one line saying why not
    peer = result["peer"]
    if "skipped" in peer:
        assert "gpu-check: peer ratio skipped: no UNITER checkout" in proc.stdout, peer
    else:
        assert peer["vlp_over_reference"] > 0 and peer["family"] == "uniter-tiny", peer
    # issue 43: the extractor alone on photos of mixed sizes against the same photos at one
    # size (butd-tiny here; butd-r101-c4 at 600/1000 on the GPU), the passes alternated
    extract = result["extract"]
    assert extract["model"] == "butd-tiny" and extract["images"] == 6
    assert len(extract["round_ratios"]) == extract["rounds"] == 2
    assert extract["uniform_images_per_s"] > 0 and extract["mixed_images_per_s"] > 0
    assert extract["ratio_mixed_over_uniform"] == pytest.approx(
        extract["mixed_images_per_s"] / extract["uniform_images_per_s"])
    assert 0 < extract["mixed_mpixel_per_image"] and 0 < extract["uniform_mpixel_per_image"]
    assert "extract.ratio_mixed_over_uniform" in result["goals"]
    lines = proc.stdout.splitlines()
    assert "pretrain_uniter_tiny.loop_overhead" in " ".join(lines)
    assert lines[-1] == f"json {out}"
