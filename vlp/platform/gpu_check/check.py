"""The GPU check (``make gpu-check``, docs/gpu-check.md): vlp's CUDA paths on one GPU, through
the worker side of a job without Ray (the local runner: the loop, DeepSpeed's engine, the
prefetcher, the local batch stream, checkpoints to a folder). ``Check`` runs the sections
(``runs``, ``timing``, ``anatomy``, ``batcher_load`` measure) and gathers their figures;
``jobs/benchmarks/gpu_check.py`` is its entry script, and the cluster check reuses the parts.
"""

from __future__ import annotations

import json
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path

import torch

from vlp.platform.gpu_check import anatomy, batcher_load, runs, timing

GOALS = {"mfu_real_uniter_base_bf16": ">= 0.50 (H100)", "loop_overhead": "<= 1.05",
         "bf16_vs_fp32_max_rel_diff": "<= 0.01", "host_syncs_forward_backward": "0",
         "extract.ratio_mixed_over_uniform": ">= 0.9",
         "peer.vlp_over_reference": ">= 3 (uniter-base, bf16, per input unit)"}
ROOT = Path(__file__).resolve().parents[3]   # the repository (make gpu-wheels' .whl/)


def sizes(quick: bool, gpu: bool) -> dict:
    # world: image shards shaped like a real job's (bench_sources.py); sweep: the bare loop
    # again on micro-batches this many times larger (where the step stops being host-bound)
    if quick:
        return dict(family="uniter-tiny", large=None, units=512, steps=8, skip=2,
                    compare_steps=6, bare=6, steady=6, syncs=2, profile=3, resume_steps=4,
                    batcher=10,
                    sdpa=(8, 2, 64, 32), world=dict(images=60, feature_dim=64, num_classes=21),
                    sweep=(2,), sweep_steps=2,
                    peer=dict(batch=8, text_len=12, regions=10, steps=2, rounds=2),
                    extract=dict(model="butd-tiny", images=6, batch=3, short_side=96,
                                 long_side=160, rounds=2))
    return dict(family="uniter-base", large="uniter-large", units=10240, steps=80, skip=20,
                compare_steps=50, bare=40, steady=24, syncs=4, profile=8, resume_steps=6,
                batcher=60,
                sdpa=(96, 12, 110, 64),
                world=dict(images=3000, feature_dim=2048, num_classes=1601),
                sweep=(2, 4), sweep_steps=12,
                # UNITER's 10,240 input units a micro-batch: 160 pairs × (28 + 36)
                peer=dict(batch=160, text_len=28, regions=36, steps=5, rounds=3),
                # BUTD's settings (Anderson et al.): shorter side 600, longer at most 1000
                extract=dict(model="butd-r101-c4", images=48, batch=8, short_side=600,
                             long_side=1000, rounds=2))


class Check:
    def __init__(self, args, path: Path, make_batch=None):
        self.args, self.t0, self.path = args, time.perf_counter(), path
        self.make_batch = make_batch   # the peer ratio's batches (vlp.testing's example_batch)
        self.gpu = args.device == "cuda"
        self.device = torch.device("cuda", 0) if self.gpu else torch.device("cpu")
        self.size = sizes(args.quick, self.gpu)
        self.bf16 = "bf16"
        self.out: dict = {"device": torch.cuda.get_device_name(0) if self.gpu else "cpu",
                          "torch": torch.__version__, "quick": args.quick, "goals": GOALS,
                          "errors": {}}
        self.tmp = Path(tempfile.mkdtemp(prefix="vlp-gpu-check-"))
        self.world = Path(args.world) if args.world else self._world()

    def _world(self) -> Path:
        from vlp.datasets.synth.real_shapes import write_bench_sources

        t0 = time.perf_counter()
        write_bench_sources(self.tmp / "world", **self.size["world"])
        self.out["world"] = {**self.size["world"], "written_s": time.perf_counter() - t0}
        return self.tmp / "world"

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def cfg(self, name, *, family=None, precision=None, steps=None, log_every=None,
            interval=1000, extra=(), units=None):
        s = self.size
        steps = steps or s["steps"]
        return runs.experiment(self.world, self.tmp / "runs", name,
                                family=family or s["family"], precision=precision or self.bf16,
                                steps=steps, units=units or s["units"], gpu=self.gpu,
                                log_every=log_every or steps, interval=interval, extra=extra,
                                tokenizer=self.args.tokenizer)

    def section(self, name, fn):
        # --parts: a partial check (a second try on a lent machine); the rest is skipped
        if self.args.parts and name.split("_")[0] not in self.args.parts.split(","):
            return
        t0 = time.perf_counter()
        try:
            self.out[name] = fn()
        except Exception as e:   # one failed part must not hide the others' figures
            self.out["errors"][name] = "".join(traceback.format_exception_only(e)).strip()
            traceback.print_exc()
        self.out.setdefault("section_s", {})[name] = time.perf_counter() - t0
        print(f"[gpu-check] {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        self.save()

    def save(self) -> None:
        """The JSON so far, after every section: a call cut off at its time limit still
        brings back the sections it finished."""
        self.out["wall_s"] = self.elapsed()
        tmp = self.path.with_suffix(".partial")
        tmp.write_text(json.dumps(self.out, indent=1, default=str))
        tmp.replace(self.path)

    # ---- the parts -----------------------------------------------------------------------

    def pretrain(self, family: str) -> dict:
        s = self.size
        cfg = self.cfg(f"steps-{family}", family=family)
        kept = {}

        def after(worker):   # the run's engine: the bare loop and the sync count on it
            dtype = worker.dtype
            items = runs.device_batches(cfg, self.device, dtype, s["bare"] + s["syncs"])
            kept["bare"] = timing.bare_loop(worker.engine, items[:s["bare"]], self.device)
            kept["syncs"] = anatomy.host_syncs(worker.engine, items[s["bare"]:], self.device)
            kept["ops"] = anatomy.host_ops(worker.engine, items[s["bare"]:])
            diagnostics = {"steady": (partial(timing.steady_bare, batcher_cfg=cfg),
                                      s["steady"]),
                           "profile": (anatomy.profile_steps, s["profile"])}
            for name, (fn, n) in diagnostics.items():
                try:   # diagnostics: a failure here must not lose the figures above
                    kept[name] = fn(worker.engine, items[:n], self.device)
                except Exception as e:
                    kept[name] = {"error": "".join(traceback.format_exception_only(e)).strip()}
            if self.gpu:
                kept["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
            if family == s["family"]:
                kept["sweep"] = self.micro_batch_sweep(worker, family)

        # the same run twice in this process: the first ("cold") meets every (batch, length)
        # shape for the first time (kernel plans, allocator growth); the second sees only
        # shapes seen before, as a long run soon does, and so does the bare loop after it
        cold = runs.step_figures(runs.run(self.cfg(f"cold-{family}", family=family)),
                                  s["skip"])
        if self.gpu:
            torch.cuda.reset_peak_memory_stats()
        value = runs.run(cfg, after)
        figures = runs.step_figures(value, s["skip"])
        peak = value_peak(value)
        if peak:
            figures["mfu"] = figures["model_tflops_per_s"] * 1e12 / peak
            figures["mfu_real"] = figures["model_tflops_per_s_real"] * 1e12 / peak
        figures.update(kept.pop("bare", {}))
        figures["loop_overhead"] = figures["s_per_input_unit"] / figures["bare_s_per_input_unit"]
        figures["loop_overhead_median_step"] = (figures["median_s_per_input_unit"]
                                                / figures["bare_s_per_input_unit"])
        if peak:   # the model's rate with batches already on the device (no batcher limit)
            per_unit = figures["model_tflops_per_s_real"] * 1e12 * figures["s_per_input_unit"]
            figures["bare_mfu_real"] = per_unit / figures["bare_s_per_input_unit"] / peak
            for row in kept.get("sweep", {}).values():
                if isinstance(row, dict) and "steady_s_per_input_unit" in row:
                    row["steady_mfu_real"] = per_unit / row["steady_s_per_input_unit"] / peak
            steady = kept.get("steady", {})
            if "configured" in steady:   # MFU of the steady pass as the run is configured
                steady["mfu_real"] = (per_unit / steady[f"{steady['configured']}_s_per_input_"
                                                         f"unit"] / peak)
            if "varlen_attention_s_per_input_unit" in steady:   # the same real tokens
                steady["varlen_attention_mfu_real"] = (
                    per_unit / steady["varlen_attention_s_per_input_unit"] / peak)
        figures["host_syncs"] = kept.pop("syncs", {})
        figures["host_ops"] = kept.pop("ops", {})
        if figures["host_ops"]:   # the bare step over its ops: the host cost per op, if host-bound
            figures["host_ops"]["bare_step_us_per_op"] = (
                figures["bare_s_per_input_unit"] * s["units"] * 1e6
                / figures["host_ops"]["per_step"])
        figures.update(kept)
        figures["builder"] = cfg.train.batch_builder
        figures["other_builder"] = self.other_builder(family, figures)
        figures["cold"] = {k: cold[k] for k in ("step_time_s", "step_time_mean_s",
                                                "s_per_input_unit", "slow_steps",
                                                "slow_steps_wall_share")}
        figures["cold"]["loop_overhead"] = (cold["s_per_input_unit"]
                                            / figures["bare_s_per_input_unit"])
        return figures

    def other_builder(self, family: str, figures: dict) -> dict:
        """The run again (warm shapes) with its batches built in the builder process, then
        once more on the thread: the main run builds them as jobs do by default
        (``train.batch_builder: thread``, sharing the GIL with the step's dispatching). The
        thread's second run shows how much a run moves for its place in the order alone;
        ``process_over_thread`` compares with the mean of the two thread runs."""
        rows: dict = {}
        for name, kind in (("process", "process"), ("thread_again", "thread")):
            try:
                value = runs.run(self.cfg(f"{name}-{family}", family=family,
                                          extra=(f"train.batch_builder={kind}",)))
            except Exception as e:   # must not lose the main run's figures
                rows[name] = {"error": "".join(traceback.format_exception_only(e)).strip()}
                continue
            f = runs.step_figures(value, self.size["skip"])
            row = {"builder": kind, **{k: f[k] for k in ("step_time_s", "s_per_input_unit",
                                                          "median_s_per_input_unit",
                                                          "data_wait_share")}}
            row["loop_overhead"] = f["s_per_input_unit"] / figures["bare_s_per_input_unit"]
            row["over_main"] = f["s_per_input_unit"] / figures["s_per_input_unit"]
            rows[name] = row
        if all("s_per_input_unit" in r for r in rows.values()):
            thread = (figures["s_per_input_unit"] + rows["thread_again"]["s_per_input_unit"]) / 2
            rows["process_over_thread"] = rows["process"]["s_per_input_unit"] / thread
        return rows

    def micro_batch_sweep(self, worker, family: str) -> dict:
        """The bare loop on the run's engine with micro-batches ``sweep`` times larger, timed
        on a second pass over the same batches (as ``steady``): how far a bigger micro-batch
        (fewer accumulation steps for the same global batch) takes a host-bound step
        towards the device's rate."""
        s, out = self.size, {}
        for mult in s["sweep"]:
            units = s["units"] * mult
            try:   # a size that does not fit must not lose the run's figures
                if self.gpu:
                    torch.cuda.reset_peak_memory_stats()
                cfg = self.cfg(f"sweep-{family}-{units}", family=family, units=units)
                items = runs.device_batches(cfg, self.device, worker.dtype,
                                             s["sweep_steps"])
                seconds = timing.second_pass_s(worker.engine, items, self.device)
                row = {"steady_s_per_input_unit":
                       seconds / sum(i.input_units for i in items), "steps": len(items)}
                if self.gpu:
                    row["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
            except Exception as e:
                row = {"error": "".join(traceback.format_exception_only(e)).strip()}
            out[f"units_{units}"] = row
        return out

    def precision_compare(self) -> dict:
        s = self.size
        means = {}
        # fp32_zero1: fp32 through DeepSpeed's flat ZeRO-1 optimizer, the bf16 run's kind:
        # against fp32 (ZeRO-0) it shows the optimizer paths agree, so that the bf16 gap is
        # rounding alone (before engine.zero_fill_missing_grads they did not: 2% on the H200)
        for label, precision, tf32, extra in (
                ("bf16", "bf16", True, ()), ("fp32_tf32", "fp32", True, ()),
                ("fp32", "fp32", False, ()),
                ("fp32_zero1", "fp32", False, ("train.zero_stage=1",))):
            if precision == "fp32" and tf32 and not self.gpu:
                continue   # TF32 is a CUDA setting
            with runs.tf32(tf32):
                value = runs.run(self.cfg(f"compare-{label}", precision=precision,
                                           steps=s["compare_steps"], extra=extra))
            means[label] = runs.per_task_means(value)
        out = {"steps": s["compare_steps"], "per_task_mean_loss": means}
        out["bf16_vs_fp32_max_rel_diff"] = runs.max_relative_difference(means["bf16"],
                                                                         means["fp32"])
        if "fp32_tf32" in means:
            out["tf32_vs_fp32_max_rel_diff"] = runs.max_relative_difference(
                means["fp32_tf32"], means["fp32"])
        out["zero1_vs_zero0_fp32_max_rel_diff"] = runs.max_relative_difference(
            means["fp32_zero1"], means["fp32"])
        return out

    def resume(self) -> dict:
        n = self.size["resume_steps"]
        cut = n // 2
        # the smallest family: what is checked is the engine's and the RNG's state, not size
        kw = dict(family="uniter-tiny", steps=n, log_every=1, interval=cut)
        straight = runs.run(self.cfg("resume-straight", **kw))
        runs.run(self.cfg("resume-cut", extra=(f"train.stop_after={cut}",), **kw), keep=True)
        resumed = runs.run(self.cfg("resume-cut", **kw))
        want = {r["step"]: r["loss"] for r in straight["history"]}
        got = {r["step"]: r["loss"] for r in resumed["history"]}
        return {"resumed_at": resumed["start_step"], "steps_compared": sorted(got),
                "next_step_loss_equal": got.get(cut + 1) == want.get(cut + 1),
                "all_after_equal": all(got[k] == want[k] for k in got),
                "max_abs_diff": max(abs(got[k] - want[k]) for k in got)}

    def sdpa(self) -> dict:
        b, h, length, d = self.size["sdpa"]
        dtype = torch.bfloat16 if self.gpu else torch.float32
        return anatomy.sdpa_kernels(self.device, dtype, b, length, h, d)

    def peer(self) -> dict:
        """vlp's model against the official UNITER model on the same batches (peer.py)."""
        from vlp.platform.gpu_check import peer

        repo, why = peer.find_reference(getattr(self.args, "uniter_repo", None), ROOT)
        if repo is not None and self.make_batch is None:
            repo, why = None, "no batch maker handed to Check (make_batch=example_batch)"
        if repo is None:
            print(f"gpu-check: peer ratio skipped: {why}", flush=True)
            return {"skipped": why}
        w = self.size["world"]
        return peer.peer_ratio(repo, self.size["family"], self.device, self.make_batch,
                               autocast=torch.bfloat16 if self.gpu else None,
                               feat_dim=w["feature_dim"], num_classes=w["num_classes"],
                               **self.size["peer"])

    def batcher(self, steps: dict | None) -> dict:
        out = batcher_load.batcher_rate(self.cfg("batcher"), self.size["batcher"],
                                 warm=self.size["batcher"] // 3)
        if steps:
            out["batcher_over_step_consumption"] = (out["batcher_input_units_per_s"]
                                                    / steps["input_units_per_s"])
        return out

    def compile_whatif(self) -> dict:
        """The encoder under torch.compile against eager on one engine and the same batches,
        at the run's micro-batch and the sweep's largest (see timing.compiled_steady)."""
        s, kept = self.size, {}

        def after(worker):
            batches = {}
            for units in (s["units"], s["units"] * max(s["sweep"])):
                cfg = self.cfg(f"compile-{units}", units=units)
                n = s["bare"] if units == s["units"] else s["sweep_steps"]
                batches[units] = runs.device_batches(cfg, self.device, worker.dtype, n)
            kept.update(timing.compiled_steady(worker.engine, batches, self.device))
        runs.run(self.cfg("compile", steps=3), after)
        return kept

    def extract(self) -> dict:
        """The extractor alone (no Ray; extract_throughput.py's ``--mixed-sizes``): images/s on
        photos of mixed sizes (each its own size, a third portrait; one padded canvas per
        orientation a batch) against the same photos resized to 480×640, the passes
        alternated. Goal: mixed ≥ 0.9 × uniform."""
        from vlp.models.vision.extractors.base import ExtractSettings
        from vlp.platform.extract.model_rate import mixed_vs_uniform

        e = self.size["extract"]
        settings = ExtractSettings(short_side=e["short_side"], long_side=e["long_side"])
        # the check's thread count unchanged (the bench sets the count it is given)
        return mixed_vs_uniform(e["model"], settings, e["images"], e["batch"],
                                torch.get_num_threads(), self.gpu, e["rounds"])

    def run_all(self) -> dict:
        s = self.size
        self.section("pretrain_" + s["family"].replace("-", "_"),
                     lambda: self.pretrain(s["family"]))
        self.section("precision", self.precision_compare)
        self.section("resume", self.resume)
        self.section("sdpa", self.sdpa)
        self.section("peer", self.peer)
        main = self.out.get("pretrain_" + s["family"].replace("-", "_"))
        self.section("batcher", lambda: self.batcher(main))
        if self.args.parts and "compile" in self.args.parts.split(","):
            # only when asked for: it compiles for minutes (151 s on the H200, 2026-11-27)
            self.section("compile", self.compile_whatif)
        self.section("extract", self.extract)
        # uniter-large if the budget leaves room (≤ 8 minutes on one H100 in all)
        if s["large"] and self.elapsed() < self.args.budget_s * 0.7:
            self.section("pretrain_" + s["large"].replace("-", "_"),
                         lambda: self.pretrain(s["large"]))
        self.out["wall_s"] = self.elapsed()
        return self.out


def value_peak(value: dict) -> float | None:
    from vlp.platform.training.device_peaks import device_name, peak_flops

    if not torch.cuda.is_available():
        return None
    return peak_flops(device_name(torch.device("cuda", 0)), "bf16")


def figure_lines(out: dict, prefix: str = "") -> list[str]:
    lines = []
    for k, v in out.items():
        if isinstance(v, dict):
            lines += figure_lines(v, f"{prefix}{k}.")
        elif isinstance(v, float):
            lines.append(f"{prefix}{k} {v:.4g}")
        elif isinstance(v, (int, bool, str)) or v is None:
            lines.append(f"{prefix}{k} {v}")
    return lines
