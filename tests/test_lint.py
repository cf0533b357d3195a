"""The lint gate: CI runs ``ruff check src tests benchmarks`` with the project's config in pyproject.toml before
the tests (.ci/run), so the tree itself is checked there, once. Here: that the config catches what the gate is for
(undefined names such as the ``NameError`` once waiting in ``resdecay demo --diffusion``, unused imports), and
that CI runs the lint step before pytest."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINTED = ("src", "tests", "benchmarks")


def ruff_command() -> list[str]:
    """ruff from this interpreter's environment (the `test` extra installs it), else from PATH."""
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    exe = shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (pip install -e '.[test]' installs it)")
    return [exe]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ruff_command(), "check", "--no-cache", "--output-format", "concise", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_project_config_catches_undefined_names_and_unused_imports(tmp_path):
    """The gate is only as good as its rules: the pyproject config must flag both kinds of finding it was
    introduced for."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef grid(results):\n    return plot_sample_grids(results)\n")
    r = ruff("--config", str(ROOT / "pyproject.toml"), str(bad))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "F821" in r.stdout and "plot_sample_grids" in r.stdout
    assert "F401" in r.stdout and "`os` imported but unused" in r.stdout


def test_ci_lints_before_the_tests():
    script = (ROOT / ".ci" / "run").read_text()
    lint = script.find(f".venv/bin/ruff check {' '.join(LINTED)}")
    assert lint != -1 and lint < script.find(".venv/bin/python -m pytest")
