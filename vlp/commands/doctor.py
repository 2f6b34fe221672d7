"""`vlp doctor`: check a Ray cluster before a run spends GPUs on it (the work is in
vlp/platform/cluster/doctor.py)."""

from __future__ import annotations

import argparse
import sys

DESCRIPTION = """\
Check the Ray cluster a run would use and print one table, a row per node: its GPUs and
accelerator type (CPU nodes say so); the all-reduce bus bandwidth within the node and, in the
last row, between nodes (NCCL on GPUs, gloo on CPUs; NCCL's busbw = bytes/s x 2(n-1)/n, beside
what the GPU's link or the instance's network should give); the run storage's write and read
rates and a read-back of another node's file (the storage is shared); the MLflow tracking
server reached from the node; DeepSpeed as the node's engines load it (its accelerator);
one short training step per node type (forward, backward, AdamW on a random MLM batch) with
its MFU (CPU: the step time, MFU n/a). Storage and tracking are the config's, resolved as a
job resolves them (run.storage, else $VLP_STORAGE, else run.output_dir; mlflow.tracking_uri,
else $MLFLOW_TRACKING_URI, else the embedded store).

Every failure is one line naming the node and what to do; the exit status is 1 when any
check failed, 0 when all passed. The doctor's ranks ask for no CPU and one GPU each: GPUs
another job holds are reported as not placed after --timeout."""

EPILOG = """\
examples:
  vlp doctor --config jobs/configs/uniter-base-indomain.yaml       # on the head, or a node
  RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
      vlp doctor --config jobs/configs/uniter-base-indomain.yaml    # from a laptop
  vlp doctor --address 127.0.0.1:6379 --storage s3://bucket/runs --tracking-uri http://head:5000

docs/cluster.md shows what a good table looks like."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="the Ray cluster (GCS host:port, or RAY_ADDRESS's forms); "
                                     "default: RAY_ADDRESS (set by `ray job submit`), else the "
                                     "cluster `ray start` runs on this node")
    p.add_argument("--config", help="an experiment config: its run storage and tracking URI "
                                    "are the ones checked")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of --config (repeatable)")
    p.add_argument("--storage", help="the run storage to check (path or URI); wins over the "
                                     "config and $VLP_STORAGE")
    p.add_argument("--tracking-uri", help="the MLflow tracking URI to check; wins over the "
                                          "config and $MLFLOW_TRACKING_URI")
    p.add_argument("--storage-mb", type=int, default=64,
                   help="MiB each node writes and reads (default 64)")
    p.add_argument("--allreduce-mb", type=int, default=0,
                   help="MiB of each all-reduce (default: 256 on GPUs, 16 on CPUs)")
    p.add_argument("--family", default="",
                   help="the training step's model (default: uniter-base on GPUs, uniter-tiny "
                        "on CPUs)")
    p.add_argument("--no-step", action="store_true", help="skip the training step")
    p.add_argument("--timeout", type=float, default=180.0,
                   help="seconds to wait for the ranks to be placed (default 180)")


def register(sub) -> None:
    p = sub.add_parser("doctor", help="check a Ray cluster before a run: GPUs, interconnect, "
                                      "storage, tracking, DeepSpeed, a training step",
                       description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def options(args: argparse.Namespace):
    """The doctor's options: storage and tracking resolved as a job resolves them."""
    from vlp.platform.cluster import run_storage
    from vlp.platform.cluster.doctor import DoctorOptions

    if args.config:
        from vlp.platform.pretrain.job import load_pretrain_config
        from vlp.platform.pretrain.run import resolve

        cfg = resolve(load_pretrain_config(args.config, args.set))
        storage, tracking = cfg.run.storage, (cfg.mlflow.tracking_uri
                                              if cfg.mlflow.enabled else "")
    else:
        from pathlib import Path

        from vlp.platform.tracking.choice import choose_tracking_uri

        storage = run_storage.resolve("", "runs").root
        tracking = choose_tracking_uri("", Path("runs").resolve())
    if args.storage:
        storage = run_storage.open_location(args.storage).root
    return DoctorOptions(storage=storage, tracking_uri=args.tracking_uri or tracking,
                         storage_mb=args.storage_mb, allreduce_mb=args.allreduce_mb,
                         family=args.family, step=not args.no_step, timeout_s=args.timeout)


def run(args: argparse.Namespace) -> int:
    from vlp.platform.cluster.doctor import run_doctor
    from vlp.platform.cluster.doctor_table import lines
    from vlp.platform.cluster.ray_session import ensure_ray

    opts = options(args)
    ensure_ray(1, address=args.address, log_to_driver=False)
    report = run_doctor(opts, say=lambda s: print(s, file=sys.stderr, flush=True))
    for line in lines(report):
        print(line, flush=True)
    return 0 if report.ok else 1
