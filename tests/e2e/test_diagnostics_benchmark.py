"""benchmarks/diagnostics_cost.py at its smoke size: every row runs and is set against the forward reference;
a bad argument is one line, exit 2, before torch loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics_cost.py"


def test_smoke_run_times_every_row_against_the_forward(tmp_path):
    """diagnostics_cost.py at a toy size (a 2-block ViT on 16 images): the table and the JSON rows."""
    out = tmp_path / "cost.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--model", "vit_tiny_patch16_224", "--img-size", "32", "--patch", "8",
                        "--depth", "2", "--images", "16", "--knockout-images", "8", "--threads", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    seconds = json.loads(out.read_text())["seconds"]
    assert list(seconds) == ["forward", "paths", "pixels", "knockout", "all"] and all(s > 0 for s in seconds.values())
    assert "x forward" in r.stdout and "2 blocks" in r.stdout
    r = subprocess.run([sys.executable, str(SCRIPT), "--rows", "all,nope"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--rows 'nope' is unknown" in r.stderr


def test_a_bad_argument_is_one_line():
    r = subprocess.run([sys.executable, str(SCRIPT), "--img-size", "30", "--patch", "8"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("is not a multiple of --patch 8")
