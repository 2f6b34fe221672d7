"""`vlp evaluate`: zero-shot retrieval of a pretraining checkpoint, from its ITM head."""

from __future__ import annotations

import argparse

from vlp.commands.finetune import add_common, overrides


def register(sub) -> None:
    p = sub.add_parser("evaluate", help="zero-shot retrieval from the pretrained ITM head",
                       description="Score every (text, image) pair of the retrieval split with "
                                   "the checkpoint's pretrained ITM head (no finetuning), "
                                   "spread over Ray Train workers; print IR/TR R@1/5/10 one "
                                   "figure per line and log an MLflow child run with the "
                                   "predictions file.",
                       epilog="example:\n  vlp evaluate --checkpoint runs/pretrain "
                              "--world runs/demo/world --eval-split test",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from vlp.platform.finetune import load_finetune_config
    from vlp.platform.finetune.zero_shot import evaluate_zero_shot

    if not args.checkpoint or args.checkpoint.lower() == "none":
        raise ValueError("--checkpoint PATH is required: zero-shot scores a pretrained ITM head")
    args.benchmarks = args.benchmarks or "retrieval"
    cfg = load_finetune_config(args.config, overrides(args))
    for name, report in evaluate_zero_shot(cfg).items():
        for k, v in report.metrics.items():
            print(f"{name}.zero_shot.{k} {v:.2f}")
    return 0
