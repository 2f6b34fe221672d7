"""One module per `vlp` subcommand; see vlp/cli.py for the registry."""
