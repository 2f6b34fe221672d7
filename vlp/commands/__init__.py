"""One module per `vlp` subcommand (``vlp data ...`` in ``commands/data/``); ``vlp/cli.py``
registers them by name. Commands parse arguments and call ``vlp.platform``; they hold no
experiment logic of their own."""
