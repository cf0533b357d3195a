"""Fixtures of the docs/results/ script tests (test_results_scripts.py, test_results_alternatives.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


@pytest.fixture
def clone(tmp_path) -> Path:
    """A fresh clone's docs/results/ (and nothing else: no .venv, no runs/)."""
    root = tmp_path / "clone"
    shutil.copytree(RESULTS, root / "docs" / "results")
    return root
