"""docs/coverage.md's coverage table is generated (tools/adapter_coverage.py) and current: its rows are the models
the adapter tests build, and its text is what docs/coverage.json (the last run's checks and versions) gives."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_coverage_table_is_the_generated_one(capsys):
    tool = runpy.run_path(str(ROOT / "tools" / "adapter_coverage.py"), run_name="coverage_tool")
    assert tool["main"](["--check"]) == 0, capsys.readouterr().out
    data = json.loads((ROOT / "docs" / "coverage.json").read_text())
    assert all(row["checks"] and all(row["checks"].values()) for row in data["rows"])  # every recorded check passed
    assert {"torch", "timm", "transformers", "diffusers", "torchvision"} <= set(data["versions"])
    assert any(row["reached"] == "traced" for row in data["rows"]) and any(
        row["reached"] == "explicit" for row in data["rows"])
