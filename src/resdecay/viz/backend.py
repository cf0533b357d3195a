"""matplotlib, loaded when the first figure is drawn.

Importing ``matplotlib.pyplot`` costs about a second, and every command imports the plotting
modules, so ``resdecay --help`` or a one-line config error paid it too. ``plt`` and ``mpimg`` here
stand in for the modules until first use; the headless Agg backend is selected before pyplot loads.
"""

from __future__ import annotations

import importlib


class LazyModule:
    """A module imported on the first attribute access (``plt.subplots`` imports pyplot)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        import matplotlib

        matplotlib.use("Agg")  # no display: every figure is written to a PNG
        return getattr(importlib.import_module(self._name), attr)


plt = LazyModule("matplotlib.pyplot")
mpimg = LazyModule("matplotlib.image")
