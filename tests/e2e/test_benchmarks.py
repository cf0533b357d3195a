"""Every benchmark script still runs (issue 23, "every benchmark script has a smoke run"): each on its
smallest CPU setting, checking its table and JSON and the correctness checks it carries, not its timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.benchmarks import ROOT, run_script, run_script_here


def run_benchmark(script: str, *args: str, tmp_path: Path, capfd=None, monkeypatch=None) -> tuple[str, dict]:
    """The script's smoke run with ``--json``: (its stdout, the JSON). Given ``capfd`` and ``monkeypatch``, it runs in
    this process (``run_script_here``): a script that times what happens inside one process needs no interpreter of its
    own starting torch again (~5 s of a 2-core machine each). A script that times processes it starts (startup.py,
train_end_to_end.py) runs here too: its children are what it times."""
    out = tmp_path / "result.json"
    if capfd is not None:
        code, stdout, stderr = run_script_here(script, *args, "--json", str(out), capfd=capfd, monkeypatch=monkeypatch)
        assert code == 0, stderr[-2000:]
        return stdout, json.loads(out.read_text())
    proc = run_script(script, *args, "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, json.loads(out.read_text())


def test_batch_sweep_lists_every_batch_and_marks_the_fastest(tmp_path, capfd, monkeypatch):
    stdout, result = run_benchmark("batch_sweep.py", "--batches", "4,8", "--warmup", "1", "--steps", "1", "--rounds", "1",
                                   "--threads", "1", tmp_path=tmp_path,
                                   capfd=capfd, monkeypatch=monkeypatch)
    assert [r["batch"] for r in result["rows"]] == [4, 8]
    assert all(r["img_per_s"] > 0 and r["ms_per_step"] > 0 for r in result["rows"])
    assert stdout.count("<- fastest") == 1


def test_end_to_end_trains_from_jpegs_with_each_decoder(tmp_path, capfd, monkeypatch):
    stdout, result = run_benchmark("train_end_to_end.py", "--images", "16", "--batch-size", "4", "--epochs", "2",
                                   "--log-every", "1", "--rounds", "1", "--decoders", "pil,tensor", "--model-only",
                                   tmp_path=tmp_path, capfd=capfd, monkeypatch=monkeypatch)
    rows = {r["decoder"]: r for r in result["rows"]}
    assert set(rows) == {"pil", "tensor"}
    assert all(len(r["windows"]) == 7 and r["img_per_s"] > 0 for r in rows.values())  # 8 logged steps, the first dropped
    assert rows["pil"]["ratio_to_pil"] == 1.0
    assert "data.decoder" not in " ".join(result["overrides"])  # the decoder is set per row, not globally
    assert result["model_only_img_per_s"] > 0 and "model only" in stdout


def test_startup_times_every_row_against_torch_alone(tmp_path, capfd, monkeypatch):
    stdout, result = run_benchmark("startup.py", "--repeats", "1", "--warmup", "0", tmp_path=tmp_path, capfd=capfd,
                                   monkeypatch=monkeypatch)
    rows = {r["command"]: r for r in result["rows"]}
    assert set(rows) == {"torch alone", "resdecay CLI (--version)", "eager imports (--version)", "pretrain --print-config",
                         "digits, resdecay", "digits, sklearn"}
    assert rows["torch alone"]["over_torch_s"] == 0 and all(r["median_s"] > 0 and len(r["runs_s"]) == 1 for r in rows.values())
    assert "over torch" in stdout and "resdecay CLI (--version)" in stdout


def test_block_overhead_times_both_blocks_per_shape(tmp_path, capfd, monkeypatch):
    stdout, result = run_benchmark("block_overhead.py", "--shape", "2,8,32,2", "--shape", "2,4,16", "--warmup", "1",
                                   "--iters", "1", "--repeats", "2", "--threads", "1", tmp_path=tmp_path,
                                   capfd=capfd, monkeypatch=monkeypatch)
    rows = result["rows"]
    assert [(r["batch"], r["tokens"], r["width"], r["heads"]) for r in rows] == [(2, 8, 32, 2), (2, 4, 16, 1)]
    for r in rows:
        assert len(r["plain_ms_all"]) == len(r["decayed_ms_all"]) == 2 and r["plain_ms"] > 0 and r["decayed_ms"] > 0
        assert r["pass"] == (r["ratio"] <= result["threshold"])
    assert "(2, 8, 32, 2)" in stdout and "(2, 4, 16, 1)" in stdout


def test_residual_designs_times_every_design_against_the_plain_step(tmp_path, capfd, monkeypatch):
    """Every design of the table at a toy size: the plain reference first, ratios against it, extra parameters."""
    stdout, result = run_benchmark("residual_designs.py", "--set", "model.depth=2", "--set", "model.decoder_depth=1",
                                   "--batch-size", "2", "--warmup", "1", "--steps", "1", "--rounds", "2",
                                   "--threads", "1", tmp_path=tmp_path, capfd=capfd, monkeypatch=monkeypatch)
    rows = {r["design"]: r for r in result["rows"]}
    assert result["rows"][0]["design"] == "plain" and {"decay 0.6", "orthogonal", "learnable alpha"} <= set(rows)
    assert rows["plain"]["ratio"] == 1.0 and rows["plain"]["extra_params"] == 0
    assert rows["learnable alpha"]["extra_params"] == 4  # one trained alpha per add, two blocks x two adds
    assert all(r["ms"] > 0 and len(r["ms_all"]) == 2 for r in rows.values())
    assert "orthogonal" in stdout


def test_mae_throughput_checks_each_architecture_against_its_reference(tmp_path, capfd, monkeypatch):
    stdout, result = run_benchmark("mae_throughput.py", "--batch-size", "4", "--warmup", "1", "--steps", "1",
                                   "--rounds", "1", "--threads", "1", tmp_path=tmp_path,
                                   capfd=capfd, monkeypatch=monkeypatch)
    assert set(result["checks"]) == {"U-Net", "plain"}
    assert all(c["ok"] for c in result["checks"].values()), result["checks"]  # same loss, prediction and grads
    variants = {r["variant"]: r for r in result["rows"]}
    assert {"resdecay U-Net", "reference U-Net SDPA", "resdecay plain", "reference plain SDPA"} <= set(variants)
    assert all(r["img_per_s"] > 0 for r in variants.values())
    assert stdout.count("-> OK") == 2


def test_diffusion_throughput_rows_decayed_and_plain_per_preset(tmp_path, capfd, monkeypatch):
    stdout, result = run_benchmark("diffusion_throughput.py", "--batch-size", "4", "--warmup", "1", "--steps", "1",
                                   "--sample-n", "2", "--sample-steps", "2", "--threads", "1", tmp_path=tmp_path,
                                   capfd=capfd, monkeypatch=monkeypatch)
    by_preset: dict[str, list] = {}
    for r in result["rows"]:
        by_preset.setdefault(r["preset"], []).append(r)
        assert r["img_per_s"] == pytest.approx(r["batch"] * r["steps_per_s"]) and r["sample_img_per_s"] > 0
    assert set(by_preset) == {"uvit-tiny-fmnist", "sit-tiny-fmnist"}
    for rows in by_preset.values():
        decayed, plain = rows
        assert decayed["row"].startswith("resdecay") and plain["row"].startswith("reference")
        assert decayed["params"] > plain["params"]  # the long skips' fusion layers are the only extra parameters


def test_diffusion_throughput_times_the_repa_step_and_its_encoder_apart(tmp_path, capfd, monkeypatch):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "vit"  # a grey ViT on 28-px images in 4-px patches: sit-tiny-fmnist's 7x7 grid
    config = transformers.ViTConfig(image_size=28, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=32)
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(folder)
    stdout, result = run_benchmark("diffusion_throughput.py", "--preset", "sit-tiny-fmnist", "--batch-size", "4",
                                   "--warmup", "1", "--steps", "1", "--sample-n", "2", "--sample-steps", "2", "--threads",
                                   "1", "--repa-target", str(folder), tmp_path=tmp_path, capfd=capfd, monkeypatch=monkeypatch)
    repa = result["rows"][-1]
    assert repa["row"].startswith("resdecay + REPA") and (repa["encoder_side"], repa["encoder_grid"]) == (28, 7)
    assert 0 < repa["encoder_ms_per_step"] and repa["img_per_s"] == pytest.approx(repa["batch"] * repa["steps_per_s"])
    assert "frozen encoder's forward alone takes" in stdout


def test_eval_speed_sections_agree_with_their_references(tmp_path, capfd, monkeypatch):
    """The script named undefined names at HEAD (issue 23.1: `bank`, `queries`, `x` in closures after `del`)."""
    stdout, result = run_benchmark("eval_speed.py", "--bank", "2000", "--queries", "200", "--probe-epochs", "1",
                                   "--probe-train", "2000", "--probe-test", "500", "--rank-rows", "2000", "--repeats", "1",
                                   "--threads", "1", tmp_path=tmp_path,
                                   capfd=capfd, monkeypatch=monkeypatch)
    assert result["knn"]["check"] == "OK" and result["knn"]["bank"] == 2000
    assert result["probe"]["train"] == 2000 and result["probe"]["custom_size"]
    assert all(0 < r["top1"] <= 1 for r in result["probe"]["rows"])
    assert result["rank"]["ok"] and result["rank"]["small"]["ok"] and result["rank"]["n"] == 2000
    assert "MISMATCH" not in stdout and "target set for 200 epochs on 60,000 features" in stdout


def test_gpu_rows_smoke_mode_runs_data_throughput_on_every_decoder_path(tmp_path):
    """SMOKE=1 runs the GPU sequence's rows on the CPU with tiny settings; here its data_throughput row (the
    script's smoke run too: the other rows' scripts are run above)."""
    out = tmp_path / "rows"
    env = {**os.environ, "OUT": str(out), "SMOKE": "1", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_rows.sh"), "data_throughput"], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "--- data_throughput: exit 0" in (out / "summary.txt").read_text()
    rows = {r["path"]: r for r in json.loads((out / "data_throughput.json").read_text())["rows"]}
    assert {"pil (before)", "tensor, uint8 out", "tensor, float out"} <= set(rows)
    assert rows["pil (before)"]["ratio_to_pil"] == 1.0
    assert all(r["img_per_s_per_core"] > 0 for r in rows.values())



def test_segmentation_cost_times_every_solver_and_skips_a_row_past_the_timeout(tmp_path, capfd, monkeypatch):
    """Issue 33 item 6: the segmentation metric's cost per solver beside the kNN row; a row past
    --timeout-per-row is stopped and printed as skipped, and larger sizes of that solver are not started. Each row
    runs in a process of its own (the script started again with --_row), the script itself in this one."""
    small = ["--tokens", "4", "--dim", "16", "--classes", "3", "--epochs", "2", "--graph-rounds", "2", "--threads", "1"]
    stdout, result = run_benchmark("segmentation_cost.py", "--images", "40", *small, tmp_path=tmp_path, capfd=capfd,
                                   monkeypatch=monkeypatch)
    rows = {r["solver"]: r for r in result["rows"]}
    assert list(rows) == ["knn", "exact", "learned", "kmeans"] and all(r["status"] == "ok" for r in rows.values())
    assert all(r["seconds"] > 0 and r["images"] == 40 and r["tokens"] == 4 for r in rows.values())
    assert rows["knn"]["sanity_name"] == "knn_top1" and rows["knn"]["bank"] == rows["knn"]["queries"] == 80
    assert all(0 <= rows[s]["sanity"] <= 1 and rows[s]["sanity_name"] == "miou" for s in ("exact", "learned", "kmeans"))
    assert rows["learned"]["protocol"]["epochs"] == 2 and "mIoU (knn: top-1)" in stdout
    # the child's imports alone take longer than 0.3 s: the first row is stopped, the larger one not started
    code, stdout, stderr = run_script_here("segmentation_cost.py", "--images", "40,80", "--solvers", "learned",
                                           "--timeout-per-row", "0.3", *small, "--json", str(tmp_path / "timeout.json"),
                                           capfd=capfd, monkeypatch=monkeypatch)
    assert code == 0, stderr[-2000:]
    result = json.loads((tmp_path / "timeout.json").read_text())
    first, second = result["rows"]
    assert first["status"] == "skipped (> 0.3 s)" and "seconds" not in first
    assert second["status"] == "skipped (> 0.3 s at a smaller size)" and second["not_started"]
    assert "not measured: 40 x 4 learned skipped (> 0.3 s)" in stdout

def test_grad_checkpointing_rows_pair_each_preset_with_and_without(tmp_path, capfd, monkeypatch):
    stdout, result = run_benchmark("grad_checkpointing.py", "--presets", "mae-tiny-digits,sit-tiny-fmnist", "--batch-size",
                                   "4", "--rounds", "1", "--steps", "1", "--threads", "1", tmp_path=tmp_path,
                                   capfd=capfd, monkeypatch=monkeypatch)
    rows = [(r["preset"], r["grad_checkpointing"]) for r in result["rows"]]
    assert rows == [("mae-tiny-digits", False), ("mae-tiny-digits", True), ("sit-tiny-fmnist", False),
                    ("sit-tiny-fmnist", True)]
    assert all(r["seconds_per_step"] > 0 for r in result["rows"]) and "memory x" in stdout


@pytest.mark.parametrize("script, args, needle", [
    ("batch_sweep.py", ["--batches", "4,x"], "--batches must be positive integers"),
    ("batch_sweep.py", ["--preset", "sit-tiny-fmnist"], "times MAE presets"),
    ("train_end_to_end.py", ["--decoders", "pil,foo"], "--decoders: unknown or unavailable ['foo']"),
    ("train_end_to_end.py", ["--preset", "mae-giant"], "preset 'mae-giant' does not exist"),
    # refused by `resdecay pretrain` itself (4 images, batch 32): its one line is passed on
    ("train_end_to_end.py", ["--images", "4", "--epochs", "1", "--rounds", "1", "--decoders", "tensor"],
     "fewer than one optimizer step needs"),
    # no whole batch: every rate was 0 img/s, then a ZeroDivisionError traceback
    ("data_throughput.py", ["--images", "2", "--batch", "4"], "--images 2 is fewer than one batch (--batch 4)"),
    ("eval_speed.py", ["--rank-rows", "1"], "--rank-rows must be at least 2"),
    ("startup.py", ["--repeats", "0"], "--repeats must be a positive integer"),
    ("segmentation_cost.py", ["--tokens", "10"], "--tokens 10: tokens per image must be a square grid"),
    ("segmentation_cost.py", ["--solvers", "exact,spectral"], "choose from knn,exact,learned,kmeans"),
    ("startup.py", ["--warmup", "-1"], "--warmup must be 0 or more"),
    ("grad_checkpointing.py", ["--warmup", "0"], "--warmup must be at least 1"),
    ("grad_checkpointing.py", ["--presets", "mae-giant"], "mae-giant"),
    ("residual_designs.py", ["--designs", "plain,nope"], "--designs: unknown nope"),
    ("residual_designs.py", ["--rounds", "0"], "--rounds must be >= 1"),
    ("residual_designs.py", ["--set", "model.hyper_streams=0"], "model.hyper_streams must be an integer >= 1"),
    ("fsdp_memory.py", ["--ranks", "0"], "--ranks must be >= 1"),
    ("parallel_step.py", ["--rounds", "0"], "--rounds must be >= 1"),
    ("parallel_step.py", ["--device", "cuda"], "--device cuda: no CUDA device visible"),
    ("fsdp_memory.py", ["--presets", "mae-giant"], "--presets mae-giant"),
    # refused before any row is timed: a timm encoder without weights would be timed as a random one unasked
    ("diffusion_throughput.py", ["--preset", "sit-tiny-fmnist", "--repa-target", "timm:vit_tiny_patch16_224"],
     "train.aux_target_weights=random"),
])
def test_bad_arguments_are_one_line_exit_2(script, args, needle, capfd, monkeypatch):
    """Run in this process: a bad argument is answered before any work, so the check needs no fresh interpreter
    importing torch for each case."""
    code, _, stderr = run_script_here(script, *args, capfd=capfd, monkeypatch=monkeypatch)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr
    assert lines[0].startswith(f"{script}: error: ") and needle in lines[0], lines[0]


def test_fsdp_memory_reads_each_ranks_share_off_the_sharded_state(tmp_path):
    # in a process of its own: it starts torch's fake process group
    stdout, result = run_benchmark("fsdp_memory.py", "--presets", "mae-tiny-digits,sit-tiny-fmnist", "--ranks", "4",
                                   tmp_path=tmp_path)
    rows = {(r["preset"], r["layout"]): r for r in result["rows"]}
    for preset in ("mae-tiny-digits", "sit-tiny-fmnist"):
        ddp, fsdp = rows[preset, "ddp"], rows[preset, "fsdp2"]
        # DDP: every rank holds 4 bytes per parameter for each of weights and AdamW's two moments
        assert abs(ddp["weights_mib"] * 2 ** 20 - 4 * ddp["params"]) < 1 and ddp["optimizer_mib"] <= 2 * ddp["weights_mib"]
        # FSDP2: about a quarter (each parameter's dim-0 padded to a multiple of 4); buffers are not sharded
        for part in ("weights_mib", "grads_mib", "optimizer_mib", "ema_mib"):
            assert ddp[part] / 4 <= fsdp[part] <= ddp[part] / 4 * 1.2 + 1e-3, (preset, part)
        assert fsdp["buffers_mib"] == ddp["buffers_mib"] and fsdp["ratio"] > 3
    assert rows["sit-tiny-fmnist", "ddp"]["ema_mib"] > 0 == rows["mae-tiny-digits", "ddp"]["ema_mib"]
    assert "DDP/FSDP2" in stdout


def test_parallel_step_times_ddp_and_fsdp2_side_by_side(tmp_path):
    # in a process of its own: it starts a one-rank process group
    stdout, result = run_benchmark("parallel_step.py", "--presets", "mae-tiny-digits", "--batch-size", "8", "--warmup",
                                   "1", "--steps", "1", "--rounds", "1", "--threads", "1", tmp_path=tmp_path)
    assert [r["layout"] for r in result["rows"]] == ["ddp", "fsdp2"] and result["rows"][0]["ratio"] == 1.0
    assert all(r["ms"] > 0 and r["mfu"] is None for r in result["rows"]) and "x ddp" in stdout


def test_gpu_rows_refuses_an_unknown_row_before_doing_anything(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_rows.sh"), "mae_throughput", "nope"], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "OUT": str(tmp_path / "rows")}, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown row 'nope'" in proc.stderr
    assert not (tmp_path / "rows").exists()


def test_probing_cost_times_the_grid_ep_and_a_streamed_pass(tmp_path, capfd, monkeypatch):
    out, result = run_benchmark("probing_cost.py", "--images", "200", "--tokens", "4", "--dim", "16", "--epochs", "1",
                                "--ep-epochs", "1", "--depth", "1", "--stream-images", "300", "--budget-mb", "0.01",
                                "--imagenet-batches", "2", tmp_path=tmp_path, capfd=capfd, monkeypatch=monkeypatch)
    assert result["linear"]["heads"] == 48 and "48 heads in one pass" in out
    assert result["stream"]["images_read"] == 300 and result["stream"]["access"].startswith("streamed")
    assert result["ep"]["ep_rerunning_encoder_s"] >= result["ep"]["ep_on_cached_tokens_s"]
    big = result["imagenet"]  # ImageNet's token count, streamed: the budget holds a chunk, never the 359 GiB
    assert big["shape"] == [1_281_167, 196, 768] and big["images_read"] == 512 and big["access"].startswith("streamed")
    lin, extract = result["linear"], result["ep"]["extract_s"]  # the grid and one head after the one shared feature pass
    assert lin["end_to_end_grid_over_one"] == (extract + lin["grid_one_pass_s"]) / (extract + lin["one_head_s"])
