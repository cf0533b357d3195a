"""matplotlib, loaded when the first figure is drawn.

Importing ``matplotlib.pyplot`` costs about a second, and every command imports the plotting
modules, so ``resdecay --help`` or a one-line config error paid it too. ``plt`` and ``mpimg`` here
stand in for the modules until first use. Figures are written to PNG files, so the headless Agg
backend is selected before pyplot loads, unless pyplot was already imported (a notebook that chose
its backend keeps it).
"""

from __future__ import annotations

import importlib
import sys


class LazyModule:
    """A module imported on the first attribute access (``plt.subplots`` imports pyplot), then kept."""

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr: str):  # called only for names the stand-in itself lacks
        if self._module is None:
            if "matplotlib.pyplot" not in sys.modules:
                import matplotlib

                matplotlib.use("Agg")  # no display needed
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


plt = LazyModule("matplotlib.pyplot")
mpimg = LazyModule("matplotlib.image")
