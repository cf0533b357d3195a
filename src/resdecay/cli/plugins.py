"""User extensions loaded before the command line is built: ``--plugin FILE`` (repeatable) or
``RESDECAY_PLUGINS=a.py:b.py`` (``os.pathsep``-separated; a dotted module name works too).

A plugin is an ordinary Python file that registers what it adds when imported: a shortcut formula
(``resdecay.nn.residual.register_shortcut``), a model family (``resdecay.models.register_family``),
a metric (``resdecay.eval.metrics.register_metric``) or a block adapter
(``resdecay.nn.adapters.register_adapter``); docs/EXTENDING.md has one worked example of each of the
first three. A registration the registry refuses (a taken name) stops the command in one line naming the plugin. Plugins load *before* the parser is built because choices such as ``--evals`` come from the
registries."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from ..errors import RegistryError, UserError, one_line

ENV = "RESDECAY_PLUGINS"
LOADED: list[str] = []  # every plugin this process loaded: a resolved .py path or a module name (checkpoints record them)


def plugin_paths(argv: list[str]) -> list[str]:
    """The plugins named by ``RESDECAY_PLUGINS`` and by every ``--plugin X`` / ``--plugin=X`` in argv."""
    found = [p for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip()]
    for i, arg in enumerate(argv):
        if arg == "--plugin" and i + 1 < len(argv):
            found.append(argv[i + 1])
        elif arg.startswith("--plugin="):
            found.append(arg.split("=", 1)[1])
    return found


def load_plugin(spec: str) -> None:
    """Import one plugin: a ``.py`` file path or an importable module name. Loading the same file twice
    (named by both the environment and a flag) imports it once."""
    path = Path(spec)
    if spec.endswith(".py") or path.exists():
        if path.is_dir():
            raise UserError(f"plugin {spec} is a folder; give the path of a .py file in it that registers your extension")
        if not path.is_file():
            raise UserError(f"plugin {spec}: no such file; give the path of a .py file that registers your extension")
        if path.suffix != ".py":  # importlib finds no loader for it and fails with an AttributeError
            raise UserError(f"plugin {spec} is not a .py file; give the path of a Python file (ending in .py) that "
                            "registers your extension")
        name = f"resdecay_plugin_{path.resolve().stem}_{abs(hash(str(path.resolve()))) % 10**8}"
        if name in sys.modules:
            return
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        run, source = (lambda: module_spec.loader.exec_module(module)), str(path.resolve())
    else:
        run, source = (lambda: importlib.import_module(spec)), spec
    try:
        run()
        LOADED.append(source)
    except RegistryError as e:  # a name taken, an entry refused: say which plugin did it
        raise RegistryError(f"plugin {spec}: {one_line(e)}") from None
    except UserError:
        raise
    except (Exception, KeyboardInterrupt, SystemExit) as e:  # a plugin's own bug (or exit): name the file, one line
        raise UserError(f"plugin {spec} failed to load: {type(e).__name__}: {one_line(e) or 'raised at import'}; "
                        "fix the plugin, or drop it from --plugin / RESDECAY_PLUGINS") from e


def load_plugins(argv: list[str]) -> None:
    for spec in plugin_paths(argv):
        load_plugin(spec)
