"""benchmarks/diagnostics_cost.py at its smoke size: every row runs and is set against the forward reference;
a bad argument is one line, exit 2, before torch loads."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "diagnostics_cost.py"


def test_smoke_run_times_every_row_against_the_forward(tmp_path, capsys, monkeypatch):
    """diagnostics_cost.py at a toy size (a 2-block ViT on 16 images): the table and the JSON rows. The smoke run is
    the script as ``__main__`` in this process (it times work inside one process: a fresh interpreter would only
    import torch again); the bad argument below runs as a process, answered before torch loads."""
    out = tmp_path / "cost.json"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--model", "vit_tiny_patch16_224", "--img-size", "32", "--patch", "8",
                                      "--depth", "2", "--images", "16", "--knockout-images", "8", "--threads", "1",
                                      "--json", str(out)])
    rng, threads = torch.get_rng_state(), torch.get_num_threads()  # what the script's seed and --threads change
    try:
        runpy.run_path(str(SCRIPT), run_name="__main__")
        code = 0
    except SystemExit as e:  # what the script's process would have exited with
        code = e.code
    finally:
        torch.set_rng_state(rng)
        torch.set_num_threads(threads)
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr
    seconds = json.loads(out.read_text())["seconds"]
    assert list(seconds) == ["forward", "paths", "pixels", "knockout", "all"] and all(s > 0 for s in seconds.values())
    assert "x forward" in stdout and "2 blocks" in stdout
    r = subprocess.run([sys.executable, str(SCRIPT), "--rows", "all,nope"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--rows 'nope' is unknown" in r.stderr


def test_a_bad_argument_is_one_line():
    r = subprocess.run([sys.executable, str(SCRIPT), "--img-size", "30", "--patch", "8"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("is not a multiple of --patch 8")
