"""The ``resdecay`` command line: argument parsing and dispatch to ``resdecay.commands``.
``main`` is the console-script entry point (``resdecay = resdecay.cli:main``)."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
