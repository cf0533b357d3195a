"""The package's folders are layers: every module imports only from layers below its own (or its
own folder), and importing the modules one by one, lowest layer first, never pulls in a higher one."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "import_layers.py"
PKG = ROOT / "src" / "resdecay"

SCRIPT = r"""
import importlib, json, pkgutil, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
from import_layers import LAYERS  # the one layer table
import resdecay  # the facade; it loads schedule, errors and nn only

def layer(name):
    rel = name.split(".")[1] if "." in name else None
    return LAYERS.get(rel, 99)

names = [m.name for m in pkgutil.walk_packages(resdecay.__path__, "resdecay.") if m.name != "resdecay.__main__"]
names.sort(key=lambda n: (layer(n), n.count("."), n))
problems = []
for name in names:
    before = set(sys.modules)
    try:
        importlib.import_module(name)
    except Exception as e:
        problems.append(f"{name}: {type(e).__name__}: {e}")
        continue
    higher = sorted(m for m in set(sys.modules) - before if m.startswith("resdecay.") and layer(m) > layer(name))
    if higher:
        problems.append(f"{name} pulled in higher layers: {higher}")
print(json.dumps({"imported": len(names), "problems": problems}))
"""


@pytest.mark.slow
def test_imports_only_go_down():
    out = subprocess.run([sys.executable, str(TOOL), str(PKG)], capture_output=True, text=True, check=True).stdout
    assert "upward_imports 0 " in out and "circular_imports 0 " in out and "imports_inside_functions 0" in out, out


@pytest.mark.slow
def test_every_module_imports_in_dependency_order_in_a_fresh_interpreter():
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "src"), str(TOOL.parent)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert report["imported"] > 40 and not report["problems"], report["problems"]


ROOT_MODULES = ["resdecay.schedule", "resdecay.errors", "resdecay.io"]
HEAVY = ("matplotlib", "torchvision", "timm", "sklearn", "wandb", "mlflow", "diffusers",
         "torch.distributed.checkpoint")  # DCP: sharded runs only (train/sharded_checkpoint.py imports it on first use)

# One fresh interpreter for the import checks below, each still asserted on its own: it imports the root modules
# one by one, printing after each the package modules then loaded, then resdecay.cli.main, printing the heavy
# libraries then loaded. What is loaded only grows, so a module that loaded more on its own would show here too.
FRESH = f"""
import importlib, json, sys
seen = {{}}
for module in {ROOT_MODULES!r}:
    importlib.import_module(module)
    seen[module] = sorted(m for m in sys.modules if m.startswith('resdecay.') and m != module)
import resdecay.cli.main
seen['heavy'] = [m for m in {HEAVY!r} if m in sys.modules]
from resdecay.data.digits import load_digits_split
seen['digits'] = [len(load_digits_split(True)[0]), *(m for m in {HEAVY!r} if m in sys.modules)]
print(json.dumps(seen))
"""


@functools.cache
def fresh_interpreter_imports() -> dict:
    out = subprocess.run([sys.executable, "-c", FRESH], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ROOT_MODULES)
def test_root_modules_need_no_package_module(module):
    """The bottom layer stands alone: importing it loads nothing else of the package."""
    out = fresh_interpreter_imports()[module]
    # importing resdecay.X runs resdecay/__init__ first (the facade: schedule, nn, _version); X itself adds nothing
    assert all(m.split(".")[1] in ("schedule", "errors", "nn", "io", "_version") for m in out), out


def test_the_command_line_starts_without_the_heavy_optional_libraries():
    """`resdecay --help`, a config error or `presets` must not pay for plotting, torchvision or timm
    (together about 4 s of start-up on a 2-core CPU): they load when a figure, a ResNet or a timm
    layer is first used."""
    out = fresh_interpreter_imports()["heavy"]
    assert out == [], out


def test_the_digits_load_without_scikit_learn():
    """A digits run's processes (each torchrun rank) read the data set's file, not import scikit-learn (~2.5 s)."""
    assert fresh_interpreter_imports()["digits"] == [1437]


@pytest.mark.slow
def test_lazy_pyplot_draws_headless():
    """The stand-in selects the Agg backend before pyplot loads, so figures work without a display."""
    code = ("import sys; from resdecay.viz.backend import plt; fig, ax = plt.subplots(); "
            "import matplotlib; print(matplotlib.get_backend().lower())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != "MPLBACKEND"}).stdout
    assert out.strip() == "agg", out
    # a backend chosen before (a notebook's) is kept, not switched under open figures
    code = ("import matplotlib; matplotlib.use('pdf'); import matplotlib.pyplot as mpl_plt; from resdecay.viz.backend import plt; "
            "fig, ax = plt.subplots(); print(matplotlib.get_backend().lower(), plt.subplots is mpl_plt.subplots)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.split() == ["pdf", "True"], out
