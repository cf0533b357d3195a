"""benchmarks/hook_cost.py at its smoke size: both library models, eager and through torch.compile (its eager
backend: the compiled path without inductor's minutes), each set against the undecayified model; a bad argument
is one line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hook_cost.py"


def test_smoke_run_times_each_model_and_mode_against_the_undecayified_model(tmp_path):
    """hook_cost.py at a toy size (2 blocks, 32 px): the four rows, each with its reference and target."""
    out = tmp_path / "hooks.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--img-size", "32", "--patch", "8", "--depth", "2", "--batch", "2",
                        "--repeats", "2", "--iters", "1", "--warmup", "1", "--threads", "1", "--compile-backend", "eager",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(row["model"], row["mode"]) for row in rows] == [("timm", "eager"), ("timm", "compiled"),
                                                             ("transformers", "eager"), ("transformers", "compiled")]
    assert all(row["reference_ms"] > 0 and row["decayified_ms"] > 0 and row["hooked_adds"] == 3 for row in rows)
    assert "target <= 1.02" in r.stdout and "target <= 1.01" in r.stdout


def test_a_bad_argument_is_one_line():
    r = subprocess.run([sys.executable, str(SCRIPT), "--models", "timm,keras"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("--models 'keras' is unknown; choose from "
                                                                             "timm, transformers")
