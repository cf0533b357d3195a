"""The benchmark scripts the next GPU session will run still run: the two that drive the real
trainer or sweep batches, each on the smallest CPU setting (tables and JSON, not timings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def run_benchmark(script: str, *args: str, tmp_path: Path) -> tuple[str, dict]:
    out = tmp_path / "result.json"
    proc = run_script(script, *args, "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(out.read_text())


def test_batch_sweep_lists_every_batch_and_marks_the_fastest(tmp_path):
    stdout, result = run_benchmark("batch_sweep.py", "--batches", "4,8", "--warmup", "1", "--steps", "1", "--rounds", "1",
                                   "--threads", "1", tmp_path=tmp_path)
    assert [r["batch"] for r in result["rows"]] == [4, 8]
    assert all(r["img_per_s"] > 0 and r["ms_per_step"] > 0 for r in result["rows"])
    assert stdout.count("<- fastest") == 1


def test_end_to_end_trains_from_jpegs_with_each_decoder(tmp_path):
    stdout, result = run_benchmark("train_end_to_end.py", "--images", "16", "--batch-size", "4", "--epochs", "2",
                                   "--log-every", "1", "--rounds", "1", "--decoders", "pil,tensor", "--model-only",
                                   tmp_path=tmp_path)
    rows = {r["decoder"]: r for r in result["rows"]}
    assert set(rows) == {"pil", "tensor"}
    assert all(len(r["windows"]) == 7 and r["img_per_s"] > 0 for r in rows.values())  # 8 logged steps, the first dropped
    assert rows["pil"]["ratio_to_pil"] == 1.0
    assert "data.decoder" not in " ".join(result["overrides"])  # the decoder is set per row, not globally
    assert result["model_only_img_per_s"] > 0 and "model only" in stdout


@pytest.mark.parametrize("script, args, needle", [
    ("batch_sweep.py", ["--batches", "4,x"], "--batches must be positive integers"),
    ("batch_sweep.py", ["--preset", "sit-tiny-fmnist"], "times MAE presets"),
    ("train_end_to_end.py", ["--decoders", "pil,foo"], "--decoders: unknown or unavailable ['foo']"),
    ("train_end_to_end.py", ["--preset", "mae-giant"], "preset 'mae-giant' does not exist"),
    # refused by `resdecay pretrain` itself (4 images, batch 32): its one line is passed on
    ("train_end_to_end.py", ["--images", "4", "--epochs", "1", "--rounds", "1", "--decoders", "tensor"],
     "fewer than one optimizer step needs"),
])
def test_bad_arguments_are_one_line_exit_2(script, args, needle):
    proc = run_script(script, *args)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"{script}: error: ") and needle in lines[0], lines[0]


def test_gpu_rows_refuses_an_unknown_row_before_doing_anything(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_rows.sh"), "mae_throughput", "nope"], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "OUT": str(tmp_path / "rows")}, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown row 'nope'" in proc.stderr
    assert not (tmp_path / "rows").exists()
