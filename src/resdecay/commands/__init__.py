"""Command recipes: each ``run_*`` is one ``resdecay`` subcommand's work, built from the library
below (train, eval, viz). The CLI (``resdecay.cli``) parses arguments and calls these."""
