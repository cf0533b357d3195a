"""benchmarks/hook_cost.py at its smoke size: both library models, eager and through torch.compile (its eager
backend: the compiled path without inductor's minutes), each mechanism (hooks, fused add) set against the undecayified
model in the same rounds; a bad argument is one line, exit 2."""

from __future__ import annotations

import json

from helpers.benchmarks import run_script_here  # the script as __main__ in this process (no second torch start-up)


def test_smoke_run_times_each_model_and_mode_against_the_undecayified_model(tmp_path, capfd, monkeypatch):
    """hook_cost.py at a toy size (2 blocks, 32 px): per model and mode a row per mechanism, each with its reference
    (the same for both: one set of rounds) and target."""
    out = tmp_path / "hooks.json"
    code, stdout, stderr = run_script_here(
        "hook_cost.py", "--img-size", "32", "--patch", "8", "--depth", "2", "--batch", "2", "--repeats", "2", "--iters",
        "1", "--warmup", "1", "--threads", "1", "--compile-backend", "eager", "--json", str(out), capfd=capfd,
        monkeypatch=monkeypatch)
    assert code == 0, stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(row["model"], row["mode"], row["mechanism"]) for row in rows] == [
        (model, mode, mechanism) for model in ("timm", "transformers") for mode in ("eager", "compiled")
        for mechanism in ("hooks", "fused")]
    assert all(row["reference_ms"] > 0 and row["decayified_ms"] > 0 and row["decayed_adds"] == 3 for row in rows)
    assert all(hooks["reference_ms"] == fused["reference_ms"] for hooks, fused in zip(rows[::2], rows[1::2], strict=True))
    assert "target <= 1.02" in stdout and "target <= 1.01" in stdout


def test_a_bad_argument_is_one_line(capfd, monkeypatch):
    code, _, stderr = run_script_here("hook_cost.py", "--models", "timm,keras", capfd=capfd, monkeypatch=monkeypatch)
    assert code == 2 and stderr.strip().splitlines()[-1].endswith("--models 'keras' is unknown; choose from "
                                                                   "timm, transformers")


def test_the_cpu_clock_needs_one_thread(capfd, monkeypatch):
    """--clock cpu counts this process's CPU time: with more threads it would count their spin-waits too."""
    code, _, stderr = run_script_here("hook_cost.py", "--clock", "cpu", "--threads", "2", capfd=capfd,
                                      monkeypatch=monkeypatch)
    assert code == 2 and "give --threads 1 and --device cpu" in stderr.strip().splitlines()[-1]
