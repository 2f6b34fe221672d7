"""`vlp pretrain`: run a pretraining experiment config on Ray Train + DeepSpeed."""

from __future__ import annotations

import argparse
import sys

EXIT_INPUTS_UNREACHABLE = 3     # --check: the config is valid, some inputs are elsewhere

EPILOG = """\
examples:
  vlp data synth --scale tiny --out runs/worlds/tiny          # the data pretrain-tiny reads
  vlp pretrain --config jobs/configs/pretrain-tiny.yaml
  vlp pretrain --config jobs/configs/pretrain-tiny.yaml --set train.steps=60 \\
      --set tasks="{mlm: 1, itm: 1}" --name tiny-mlm-itm
  vlp pretrain --config jobs/configs/imagebert-base-two-stage.yaml --check
  vlp pretrain --config jobs/configs/pretrain-tiny.yaml --local --steps 4   # no Ray
  vlp pretrain --config jobs/configs/uniter-base-indomain.yaml --check   # off the cluster
  ray dashboard cluster.yaml &      # the dashboard listens on the head's 127.0.0.1 only
  RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
      python jobs/pretrain.py --config jobs/configs/uniter-base-indomain.yaml

Ray: inside a Ray job the job's cluster; on a node where `ray start` runs (the head, over
SSH) that cluster; else a private local Ray (RAY_ADDRESS=local forces one). One line says
which.

--set takes any dotted key of the config (values parsed as YAML): optimizer.lr=1e-4,
data.batch_input_units=8192, stages.1.steps=5000, scaling.num_workers=8, train.precision=bf16.
An unknown key, task or family is an error naming it, before anything starts.

The run writes OUTPUT_DIR/NAME/checkpoint_step<N> (DeepSpeed + trainer state) and one MLflow
run (params = the flattened config, the losses' means every mlflow.metric_window steps,
config YAML, loss curve, checkpoint pointer); every step's record goes to
OUTPUT_DIR/NAME/steps/*.parquet (`vlp steps OUTPUT_DIR/NAME --plot loss.png`). Running the
same NAME again resumes from its last checkpoint, exactly; once it has reached its last
step, a re-run says so in one line and exits 0 without starting Ray.
--local runs one worker, so without --name it writes NAME-local (a run of several workers
cannot resume on one). --steps N shorter than the config's warm-up shortens the warm-up to
N // 10 and says so.

--check runs every check and prints the summary (exit 0). Where the config's inputs (weights,
vocabulary, shard folders) are not reachable from this machine, it judges the config without
them and lists them with the keys to point at copies (exit 3); a bad config exits 1.
"""


def register(sub) -> None:
    p = sub.add_parser("pretrain", help="pretrain a model from an experiment config",
                       description="Pretrain a single-stream vision-language model (UNITER, "
                                   "VL-BERT, ImageBERT, SOHO) on Ray Train workers with "
                                   "DeepSpeed, from one experiment YAML: task mix, stages, "
                                   "data sources, optimizer, scaling, MLflow. Prints the "
                                   "derived sizes up front, a progress line per report, and "
                                   "the final figures one per line.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, metavar="YAML",
                   help="experiment config (jobs/configs/*.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (repeatable), e.g. optimizer.lr=1e-4")
    p.add_argument("--name", help="run name (= run.name): runs go to OUTPUT_DIR/NAME")
    p.add_argument("--output-dir", metavar="DIR", help="runs root (= run.output_dir)")
    p.add_argument("--steps", type=int, help="optimizer steps of a one-stage run (= train.steps)")
    p.add_argument("--workers", type=int, help="Ray Train workers (= scaling.num_workers)")
    p.add_argument("--gpu", action="store_true", help="one GPU per worker (= scaling.use_gpu)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: sqlite under "
                                          "OUTPUT_DIR)")
    p.add_argument("--no-mlflow", action="store_true", help="do not track in MLflow")
    p.add_argument("--parent-run-id", help="MLflow run to nest this run under (sweeps)")
    p.add_argument("--local", action="store_true",
                   help="run in this process without Ray (one worker, the local batch "
                        "stream, checkpoints to OUTPUT_DIR/NAME): for debugging on one machine")
    p.add_argument("--check", action="store_true",
                   help="validate the config and the data, print the derived sizes, exit "
                        "(no Ray, no training)")
    p.add_argument("--verbose", action="store_true",
                   help="print Ray's own output (Train logs, every worker's prints) here too; "
                        "by default it goes to a log file in the run folder")


def overrides(args: argparse.Namespace) -> list[str]:
    pairs = [("run.name", args.name), ("run.output_dir", args.output_dir),
             ("train.steps", args.steps), ("scaling.num_workers", args.workers),
             ("mlflow.tracking_uri", args.tracking_uri)]
    out = [f"{k}={v}" for k, v in pairs if v is not None]
    if args.gpu:
        out.append("scaling.use_gpu=true")
    if args.no_mlflow:
        out.append("mlflow.enabled=false")
    return out + list(args.set)


def run(args: argparse.Namespace) -> int:
    """Returns the exit status; failures print one line (VLP_DEBUG=1 raises instead)."""
    import os

    try:
        return _run(args)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        if os.environ.get("VLP_DEBUG"):
            raise
        print(f"pretrain failed: {one_line(e)}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from vlp.platform.pretrain.job import load_pretrain_config, pretrain, summary

    extra, notes = fitted_to_steps(args)
    cfg = load_pretrain_config(args.config, overrides(args) + extra)
    for note in notes:
        print(f"[vlp pretrain] {note}")
    if args.check:
        return check(args.config, cfg)
    if getattr(args, "local", False):
        cfg = local_name(args, cfg)
        from vlp.platform.pretrain.local import pretrain_local

        result = pretrain_local(cfg)
        print("\n".join(result_lines(result)))
        return 0 if result.completed or cfg.train.stop_after else 1
    from vlp.platform.cluster import console
    from vlp.platform.pretrain.job import finished_run

    done = finished_run(cfg)    # resubmitted after it ended: say so, start no Ray and no worker
    if done:
        print(f"[vlp pretrain] {done}")
        return 0
    console.configure(quiet=not getattr(args, "verbose", False))
    result = pretrain(cfg, parent_run_id=args.parent_run_id, start_ray=lambda: start_ray(cfg))
    print("\n".join(result_lines(result)))
    return 0 if result.completed or cfg.train.stop_after else 1


def check(config_path: str, cfg) -> int:
    """``--check``: every check and the summary (0); a valid config whose inputs this machine
    cannot reach (a cluster config on a laptop) is judged without them, and the inputs are
    listed with the keys that point them elsewhere (EXIT_INPUTS_UNREACHABLE)."""
    from vlp.platform.pretrain.data import check_without_inputs, prepare
    from vlp.platform.pretrain.input_reach import unreachable_inputs, unreachable_report
    from vlp.platform.pretrain.job import resolved, summary

    cfg = resolved(cfg)
    missing = unreachable_inputs(cfg)
    if missing:
        check_without_inputs(cfg)
        for line in unreachable_report(config_path, missing):
            print(f"[vlp pretrain] {line}")
        return EXIT_INPUTS_UNREACHABLE
    for line in summary(cfg, prepare(cfg)):
        print(f"[vlp pretrain] {line}")
    return 0


def fitted_to_steps(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """``--steps N`` below the config's linear warm-up: the warm-up shortened to N // 10 (the
    UNITER recipe's ratio, 10k of 100k+) so that the short run the option is for runs, with a
    line saying so; a warm-up given with ``--set`` is left to the config check."""
    from vlp.contract.config_loader import apply_overrides
    from vlp.platform.pretrain.experiment_config import OptimizerSection

    if args.steps is None or any(s.startswith("optimizer.warmup_steps=") for s in args.set):
        return [], []
    import yaml

    from pathlib import Path

    raw = apply_overrides(yaml.safe_load(Path(args.config).read_text()) or {}, args.set)
    opt = raw.get("optimizer") or {}
    defaults = OptimizerSection.model_fields
    warmup = opt.get("warmup_steps", defaults["warmup_steps"].default)
    schedule = opt.get("schedule", defaults["schedule"].default)
    if schedule != "linear" or not isinstance(warmup, int) or warmup < args.steps:
        return [], []
    fitted = args.steps // 10
    return [f"optimizer.warmup_steps={fitted}"], [
        f"--steps {args.steps}: optimizer.warmup_steps {warmup} → {fitted} to fit the run "
        f"(--set optimizer.warmup_steps=K chooses another)"]


def local_name(args: argparse.Namespace, cfg):
    """``--local`` runs one worker, so it cannot resume the config's Ray run (written by
    scaling.num_workers workers): unless the name is given, it keeps to a run of its own,
    NAME-local, beside it."""
    named = args.name or any(s.startswith("run.name=") for s in args.set)
    if named or cfg.scaling.num_workers == 1:
        return cfg
    return cfg.model_copy(update=dict(run=cfg.run.model_copy(update=dict(
        name=f"{cfg.run.name}-local"))))


def start_ray(cfg) -> None:
    """Attach to the job's cluster, or the one ``ray start`` runs on this node, or start a
    private local one (``ray_session.ensure_ray`` says which); Ray Data's per-epoch progress
    bars off (our progress lines report throughput)."""
    import ray.data

    from vlp.platform.cluster import console
    from vlp.platform.cluster.ray_session import ensure_ray

    # named here, once every check has passed: a bad input writes nothing
    ray_log = console.log_to(console.log_folder(cfg.run.storage, cfg.run.output_dir)
                             / cfg.run.name / console.RAY_LOG)
    if ray_log is not None:
        print(f"[vlp pretrain] Ray's own output → {ray_log} (--verbose prints it here)")
    ray.data.DataContext.get_current().enable_progress_bars = False
    ensure_ray(cfg.scaling.num_workers * cfg.scaling.cpus_per_worker)


def result_lines(result) -> list[str]:
    """The final figures, one per line (``name value``)."""
    lines = [f"final_step {result.final_step}", f"completed {result.completed}"]
    for k in sorted(result.metrics):
        if k.endswith("_loss") or k in ("loss", "examples_per_s", "input_units_per_s",
                                         "examples_seen"):
            lines.append(f"{k} {result.metrics[k]:.4f}")
    lines += [f"checkpoint {result.checkpoint_path}", f"mlflow_run_id {result.mlflow_run_id}",
              f"tracking_uri {result.tracking_uri}"]
    return lines


def one_line(e: BaseException) -> str:
    """``Type: message`` on one line (config errors list their keys separated by ';')."""
    head, *rest = [part.strip() for part in str(e).splitlines() if part.strip()] or [""]
    return f"{type(e).__name__}: {head}" + (" " + "; ".join(rest) if rest else "")
