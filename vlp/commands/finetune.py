"""`vlp finetune`: finetune a pretrained checkpoint on downstream benchmarks, report Meta-Sum."""

from __future__ import annotations

import argparse

EPILOG = """\
benchmarks (--benchmarks, comma-separated; default: the Meta-Sum four):
  vqa          VQA v2-style, VQA score (official evaluator)
  retrieval    Flickr30K-style image/text retrieval, R@1/5/10 per direction;
               settings.retrieval.options.loss = margin | binary | in-batch-binary | mce | triplet
  nlvr2        NLVR2, accuracy; settings.nlvr2.options.variant = triplet | pair | pair-biattn
  refcoco+     RefCOCO+ on detected boxes, accuracy (IoU > 0.5);
               settings.refcoco+.options.head = softmax | per-roi-binary
  refcoco+-gt  RefCOCO+ on ground-truth boxes
  ve           SNLI-VE, accuracy
  vcr          VCR Q->A, QA->R, Q->AR
Meta-Sum (UNITER Table 3) = VQA + IR mean(R@1,5,10) + TR mean(R@1,5,10) + NLVR2 + RefCOCO+ (det).
Unset, those options take the family's paper's protocol (protocol: family; --set protocol=uniter
gives UNITER's to every family); each finetune prints and logs the protocol it used.

examples:
  vlp finetune --checkpoint runs/pretrain/checkpoint_step00001000 --world runs/demo/world
  vlp finetune --checkpoint none --world runs/demo/world --benchmarks vqa,nlvr2 \\
      --set settings.nlvr2.options.variant=pair --set train.steps_scale=0.5
  vlp finetune --config jobs/configs/finetune.yaml --set settings.retrieval.options.loss=binary

Each benchmark is one Ray Train + DeepSpeed run (<output-dir>/<name>-<benchmark>) and one
MLflow child run (metrics + predictions file) nested under the pretraining run that wrote the
checkpoint, under --parent-run-id, or under a parent run of its own holding Meta-Sum.
"""


def register(sub) -> None:
    p = sub.add_parser("finetune", help="finetune + evaluate a checkpoint on benchmarks (Meta-Sum)",
                       description="Finetune a pretraining checkpoint (or a fresh init) on each "
                                   "downstream benchmark through the Ray Train + DeepSpeed loop, "
                                   "evaluate it on the same workers, and report per-benchmark "
                                   "scores and Meta-Sum, one figure per line.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.add_argument("--list-benchmarks", action="store_true",
                   help="list the registered benchmarks with their options and defaults, exit")
    p.add_argument("--verbose", action="store_true",
                   help="print Ray's own output (Train logs, every worker's prints) here too; "
                        "by default it goes to a log file in the run folder")
    p.set_defaults(func=run)


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="YAML", help="a finetune config file "
                   "(jobs/configs/finetune.yaml); flags below override it")
    p.add_argument("--checkpoint", metavar="PATH",
                   help="pretraining checkpoint folder, pretraining run folder (latest "
                        "checkpoint) or state-dict file; 'none' = no pretraining (random init)")
    p.add_argument("--family", help="model family of the checkpoint (default uniter-tiny)")
    p.add_argument("--world", metavar="DIR", help="world folder with the downstream task "
                   "tables and image shards (manifest.json), or its storage URI "
                   "(s3://bucket/worlds/demo)")
    p.add_argument("--benchmarks", metavar="LIST",
                   help="comma-separated benchmark names (default vqa,retrieval,nlvr2,refcoco+)")
    p.add_argument("--name", help="run name; runs go to OUTPUT_DIR/NAME-<benchmark>")
    p.add_argument("--output-dir", metavar="DIR", help="runs root (default runs)")
    p.add_argument("--seed", type=int, help="training seed (default 0)")
    p.add_argument("--workers", type=int, help="Ray Train workers (default 1)")
    p.add_argument("--gpu", action="store_true", help="one GPU per worker")
    p.add_argument("--eval-split", choices=["val", "test"], help="evaluation split (default val)")
    p.add_argument("--parent-run-id", help="MLflow run to nest the finetune runs under")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: the pretraining run's "
                   "store, else sqlite under OUTPUT_DIR)")
    p.add_argument("--no-mlflow", action="store_true", help="do not track in MLflow")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any config key, e.g. settings.vqa.steps=300, "
                        "settings.retrieval.options.hard_negatives=true, train.precision=bf16")


def overrides(args: argparse.Namespace) -> list[str]:
    out = []
    if args.checkpoint:
        none = args.checkpoint.lower() == "none"
        out += ["model.init=random" if none else "model.init=checkpoint",
                f"model.checkpoint={'' if none else args.checkpoint}"]
    pairs = [("model.family", args.family), ("world", args.world), ("run.name", args.name),
             ("run.output_dir", args.output_dir), ("run.seed", args.seed),
             ("scaling.num_workers", args.workers), ("eval.split", args.eval_split),
             ("mlflow.parent_run_id", args.parent_run_id),
             ("mlflow.tracking_uri", args.tracking_uri)]
    out += [f"{k}={v}" for k, v in pairs if v is not None]
    if args.benchmarks:
        out.append(f"benchmarks=[{args.benchmarks}]")
    if args.gpu:
        out.append("scaling.use_gpu=true")
    if args.no_mlflow:
        out.append("mlflow.enabled=false")
    return out + list(args.set)


def list_benchmarks() -> None:
    from vlp.benchmarks import BENCHMARKS
    from vlp.platform.finetune.finetune_config import DEFAULT_LR_WIDTH, default_lr_scale

    tiny = default_lr_scale("uniter-tiny")
    print(f"(lr: at hidden width {DEFAULT_LR_WIDTH}; the default of a narrower or wider family "
          f"is scaled by {DEFAULT_LR_WIDTH} / width, e.g. uniter-tiny x{tiny:g})")
    for name, b in BENCHMARKS.items():
        d = b.defaults
        print(f"{name:12s} {b.description}")
        print(f"{'':12s} defaults: steps {d.steps}, batch {d.batch_size}, lr {d.lr:g}; "
              f"options: {', '.join(b.option_names()) or '-'}")


def run(args: argparse.Namespace) -> int:
    if args.list_benchmarks:
        list_benchmarks()
        return 0
    from vlp.platform.cluster import console
    from vlp.platform.finetune import load_finetune_config, run_finetune

    cfg = load_finetune_config(args.config, overrides(args))
    console.configure(quiet=not getattr(args, "verbose", False))   # jobs/finetune.py: no flag

    def name_ray_log() -> None:     # once the checks have passed: a bad input writes nothing
        ray_log = console.log_to(console.log_folder(cfg.run.storage, cfg.run.output_dir)
                                 / f"{cfg.run.name}-{console.RAY_LOG}")
        if ray_log is not None:
            print(f"[vlp finetune] Ray's own output → {ray_log} (--verbose prints it here)")

    report = run_finetune(cfg, before_ray=name_ray_log)
    print("\n".join(report.lines()))
    return 0
