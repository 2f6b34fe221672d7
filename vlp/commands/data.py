"""`vlp data ...`: the data subcommands, one module each (vlp/commands/data_<name>.py)."""

from __future__ import annotations

import importlib

DATA_COMMANDS = ["synth", "audit", "validate", "import", "curate"]


def register(sub) -> None:
    p = sub.add_parser("data", help="make, import, validate, audit and curate data",
                       description="Data commands: the synthetic world, importers for the "
                                   "public formats, validation, leakage audit and curation.")
    data_sub = p.add_subparsers(dest="data_command", metavar="DATA_COMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    for name in DATA_COMMANDS:
        try:
            module = importlib.import_module(f"vlp.commands.data_{name}")
        except ModuleNotFoundError as e:
            if e.name == f"vlp.commands.data_{name}":
                continue  # not built yet
            raise
        module.register(data_sub)
