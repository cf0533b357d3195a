"""The one place the version lives: the package facade, the CLI's --version, the metadata written beside
shared weights and pyproject.toml (setuptools reads it from here) all take it from this module."""

__version__ = "0.1.0"
