"""The `vlp` command. Subcommands live one per file in `vlp/commands/` and register here by name.

Each command module exposes ``register(subparsers)`` that adds its parser and sets
``func=<callable(args) -> int>``. Imports of heavy libraries happen inside the commands, so
``vlp --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name of the module in vlp/commands/ → registered in this order in `vlp --help`
COMMAND_MODULES = [
    "data",         # vlp data {synth,audit,validate,import,curate}
    "pretrain",     # vlp pretrain
    "finetune",     # vlp finetune
    "evaluate",     # vlp evaluate
    "sweep",        # vlp sweep
    "leaderboard",  # vlp leaderboard
    "steps",        # vlp steps
    "ui",           # vlp ui
    "doctor",       # vlp doctor
    "demo",         # vlp demo
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlp",
        description="vlp: Ray-distributed experimentation platform for single-stream "
                    "vision-language pretraining (UNITER, VL-BERT, ImageBERT, SOHO).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `vlp COMMAND --help` for the options of each command.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"vlp.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("vlp: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one-line reason for the user; details with VLP_DEBUG=1
        import os
        if os.environ.get("VLP_DEBUG"):
            raise
        print(f"vlp {args.command}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
