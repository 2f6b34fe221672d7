"""`vlp data ...`: the data subcommands, one module each in this package."""

from __future__ import annotations

import importlib

# subcommand → its module here (`import` is a keyword, so its module is `importing`)
DATA_COMMANDS = {"synth": "synth", "audit": "audit", "validate": "validate", "import": "importing",
                 "curate": "curate", "extract": "extract"}


def register(sub) -> None:
    p = sub.add_parser("data", help="make, import, validate, audit and curate data",
                       description="Data commands: the synthetic world, importers for the "
                                   "public formats, validation, leakage audit and curation.")
    data_sub = p.add_subparsers(dest="data_command", metavar="DATA_COMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    for module_name in DATA_COMMANDS.values():
        importlib.import_module(f"vlp.commands.data.{module_name}").register(data_sub)
