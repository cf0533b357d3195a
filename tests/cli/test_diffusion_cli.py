"""Diffusion end to end on the embedded digits: train through the one loop, sample (PNG + ADM .npz),
proxy FID, the probe grid, and the bad inputs of issue 5 (one clear line, exit code 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import assert_one_line_error, model_overrides, run
from helpers import train_online as train
from resdecay.cli import main
from resdecay.train import checkpoint as ckpt
from resdecay.train.config import load_config

# the tiny U-ViT/SiT geometry and width on the 8x8 digits; each test picks its depth
DIGITS = ["data.name=digits", *model_overrides("uvit", keys=("img_size", "patch_size", "embed_dim", "num_heads")),
          "train.epochs=2", "train.batch_size=64", "train.log_every=5", "train.warmup_epochs=0.2", "train.ema_decay=0.99"]


pytestmark = pytest.mark.usefixtures("diffusion_proxy_cache")


@pytest.fixture(scope="module")
def diffusion_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diffusion")
    runs = {}
    for name, preset, extra in (
        ("uvit", "uvit-tiny-fmnist", ["model.depth=3", "alpha_min=0.7"]),
        ("sit", "sit-tiny-fmnist", ["model.depth=2", "alpha_min=0.8"]),
        ("sit-nodrop", "sit-tiny-fmnist", ["model.depth=2", "model.class_dropout=0.0", "train.epochs=1"]),
    ):
        cfg = load_config(preset, [*DIGITS, *extra, f"train.out_dir={root / name}"])
        summary = train(cfg, progress=False)
        runs[name] = summary["checkpoint"]
    return runs


def test_training_keeps_ema_and_loss_is_finite(diffusion_runs):
    state = ckpt.load_checkpoint(diffusion_runs["uvit"])
    assert "ema" in state and state["config"]["model"]["family"] == "uvit"
    model, cfg = ckpt.load_model(diffusion_runs["uvit"], ema=True)
    assert model.alphas[-1, -1].item() == pytest.approx(0.7)


@pytest.mark.parametrize("name,sampler", [("uvit", "ddim"), ("uvit", "dpm-solver++"), ("sit", "heun"), ("sit", "euler-maruyama"),
                                          ("sit", "dopri5")])
def test_sample_writes_grid_and_adm_npz(diffusion_runs, tmp_path, capsys, name, sampler):
    extra = ["--guidance-scale", "1.5"] if name == "sit" else []
    steps = [] if sampler == "dopri5" else ["--steps", 4]  # dopri5 chooses its own steps (at most 1000 by default)
    code, out, err = run(capsys, "sample", diffusion_runs[name], "--n", 10, "--sampler", sampler, *steps,
                         "--out", tmp_path, "--no-progress", *extra)
    assert code == 0, err
    npz = next(tmp_path.glob("*.npz"))
    arr = np.load(npz)["arr_0"]
    assert arr.shape == (10, 8, 8, 1) and arr.dtype == np.uint8
    assert next(tmp_path.glob("*.png")).stat().st_size > 0
    meta = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert meta["sampler"] == sampler and meta["weights"] == "EMA"
    assert meta["cfg_scale"] == (1.5 if name == "sit" else 1.0) and f"guidance scale {meta['cfg_scale']:g}" in out
    if sampler == "dopri5":  # adaptive: the tolerances name the run, the evaluations it took are reported
        assert (meta["atol"], meta["rtol"]) == (1e-6, 1e-3) and "atol1e-06-rtol0.001" in npz.name
        assert meta["nfe"] >= 6 and "network evaluations per batch" in out
    else:
        assert meta["nfe"] == 4 * (2 if sampler == "heun" else 1) - (1 if sampler == "heun" else 0)


def test_sample_is_deterministic_given_the_seed(diffusion_runs, tmp_path, capsys):
    for d in ("a", "b"):
        assert run(capsys, "sample", diffusion_runs["uvit"], "--n", 6, "--steps", 3, "--out", tmp_path / d, "--no-progress")[0] == 0
    a, b = (np.load(next((tmp_path / d).glob("*.npz")))["arr_0"] for d in ("a", "b"))
    assert np.array_equal(a, b)


@pytest.mark.slow
def test_proxy_fid_of_samples_and_of_real_images(diffusion_runs, tmp_path, capsys):
    from resdecay.data import DataConfig, build_dataset

    code, _, err = run(capsys, "sample", diffusion_runs["uvit"], "--n", 200, "--steps", 5, "--out", tmp_path, "--no-progress")
    assert code == 0, err
    ref = tmp_path / "digits_ref.pt"
    code, out, err = run(capsys, "fid", next(tmp_path.glob("*.npz")), "--ref", "digits", "--proxy", "--ref-out", ref, "--no-progress")
    assert code == 0, err
    assert "proxy FID (" in out and ref.exists()
    fid_samples = float(out.split("proxy FID (")[1].split(":")[1].split()[0])
    # held-out real digits (test split) against the same train-split reference: closer than a 2-epoch model's samples
    ds, _ = build_dataset(DataConfig(name="digits", normalize="symmetric"), "test", 8, augment=False)
    real = np.stack([((ds[i][0] + 1) * 127.5).round().clamp(0, 255).byte().permute(1, 2, 0).numpy() for i in range(300)])
    np.savez(tmp_path / "real.npz", arr_0=real)
    code, out, err = run(capsys, "fid", tmp_path / "real.npz", "--ref", ref, "--proxy", "--no-progress")
    assert code == 0, err
    fid_real = float(out.split("proxy FID (")[1].split(":")[1].split()[0])
    assert fid_real < fid_samples


def test_online_evaluation_needs_a_proxy_dataset(tmp_path, capsys, fake_imagefolder):
    code, _, err = run(capsys, "pretrain", "--preset", "uvit-tiny-fmnist", *DIGITS, "data.name=imagefolder",
                       f"data.path={fake_imagefolder}", "model.in_chans=3", "train.batch_size=4", "train.online_eval_every=1",
                       f"train.out_dir={tmp_path / 'run'}")
    assert_one_line_error(code, err, "proxy FID, which needs one of", "train.online_eval_every=0")
    assert not list((tmp_path / "run").glob("checkpoints/*.pt"))  # refused before any training


@pytest.mark.slow
def test_online_proxy_fid_and_probe_during_training_and_plot(tmp_path, capsys):
    """train.online_eval_every on a diffusion model logs proxy FID + best probe cell per epoch from the
    EMA weights; `resdecay plot` draws both curves; too few samples for a FID is refused up front."""
    cfg = load_config("uvit-tiny-fmnist", [*DIGITS, "model.depth=3", "train.online_eval_every=1",
                                           "train.online_eval_size=200", f"train.out_dir={tmp_path / 'run'}"])
    train(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    online = [r for r in rows if "online_proxy_fid" in r]
    assert [r["epoch"] for r in online] == [1.0, 2.0]
    for r in online:
        assert 0 < r["online_proxy_fid"] < 1e4 and 0.1 < r["online_probe_best_top1"] <= 1.0
        assert r["online_probe_best_cell"]["block"] in (0, 1, 2) and r["online_protocol"]["sampler"] == "dpm-solver++"
    code, out, err = run(capsys, "plot", tmp_path / "run", "--out", tmp_path / "plot")
    assert code == 0, err
    assert (tmp_path / "plot" / "fid_and_probe.png").stat().st_size > 0 and "proxy FID" in out
    code, _, err = run(capsys, "pretrain", "--preset", "uvit-tiny-fmnist", *DIGITS, "train.online_eval_every=1",
                       "train.online_eval_size=100", f"train.out_dir={tmp_path / 'few'}")
    assert_one_line_error(code, err, "train.online_eval_size=100 is too few", "at least 129")


def test_eval_diffusion_grid(diffusion_runs, tmp_path, capsys):
    code, out, err = run(capsys, "eval-diffusion", diffusion_runs["uvit"], "--noise-levels", "0,0.5", "--max-train", 300,
                         "--max-test", 100, "--out", tmp_path, "--no-progress")
    assert code == 0, err
    grid = json.loads((tmp_path / "probe_grid.json").read_text())
    assert len(grid["top1"]) == 3 and len(grid["top1"][0]) == 2 and (tmp_path / "probe_grid.png").exists()
    assert "best cell: block" in out and grid["best"]["top1"] == max(max(r) for r in grid["top1"])
    assert grid["best"]["top1"] > 0.2  # 10 classes: chance is 0.1
    code, _, err = run(capsys, "eval-diffusion", diffusion_runs["uvit"], "--layers", "7")
    assert_one_line_error(code, err, "layer 7 is out of range", "0..2")


def test_guidance_scale_is_the_option_and_cfg_its_hidden_old_spelling(capsys):
    with pytest.raises(SystemExit) as done:
        main(["sample", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "--guidance-scale" in out and "--cfg" not in out


def test_bad_inputs_one_line_each(diffusion_runs, tmp_path, capsys):
    # class labels / guidance asked of an unconditional model
    code, _, err = run(capsys, "sample", diffusion_runs["uvit"], "--n", 2, "--labels", "1,2", "--out", tmp_path)
    assert_one_line_error(code, err, "unconditional")
    code, _, err = run(capsys, "sample", diffusion_runs["uvit"], "--n", 2, "--guidance-scale", "2", "--out", tmp_path)
    assert_one_line_error(code, err, "unconditional", "--guidance-scale")
    # guidance on a model trained without label dropout; --cfg, the old spelling, still reaches the same option
    code, _, err = run(capsys, "sample", diffusion_runs["sit-nodrop"], "--n", 2, "--cfg", "2", "--out", tmp_path)
    assert_one_line_error(code, err, "label dropout")
    # a sampler that does not fit the objective
    code, _, err = run(capsys, "sample", diffusion_runs["sit"], "--n", 2, "--sampler", "ddim", "--out", tmp_path)
    assert_one_line_error(code, err, "ddim")
    # malformed options and files
    code, _, err = run(capsys, "eval-diffusion", diffusion_runs["uvit"], "--layers", "a")
    assert_one_line_error(code, err, "--layers takes")
    code, _, err = run(capsys, "sample", diffusion_runs["uvit"], "--n", 2, "--steps", 0, "--out", tmp_path)
    assert_one_line_error(code, err, "steps")
    code, _, err = run(capsys, "sample", diffusion_runs["sit"], "--n", 2, "--sampler", "dopri5", "--rtol", 0, "--out", tmp_path)
    assert_one_line_error(code, err, "rtol (dopri5's error tolerance) must be a positive number")
    code, _, err = run(capsys, "sample", diffusion_runs["uvit"], "--n", 2, "--atol", "1e-5", "--out", tmp_path)
    assert_one_line_error(code, err, "--atol/--rtol set the dopri5 sampler's tolerances", "dpm-solver++")
    code, _, err = run(capsys, "fid", tmp_path / "missing.npz", "--ref", "digits", "--proxy")
    assert_one_line_error(code, err, "no samples file")
    np.savez(tmp_path / "ok.npz", arr_0=np.zeros((300, 8, 8, 1), np.uint8))
    code, _, err = run(capsys, "fid", tmp_path / "ok.npz", "--ref", "nonsense", "--proxy")
    assert_one_line_error(code, err, "is neither a statistics file")
    code, _, err = run(capsys, "fid", tmp_path / "ok.npz", "--ref", "digits")
    assert_one_line_error(code, err, "--inception-weights", "--proxy")
    code, _, err = run(capsys, "pretrain", "--preset", "sit-tiny-fmnist", "data.name=latents", f"train.out_dir={tmp_path / 'l'}")
    assert_one_line_error(code, err, "no cached latents", "resdecay latents")
    # missing VAE / Inception weights
    code, _, err = run(capsys, "latents", "--vae", tmp_path / "no-vae", "--data", "digits", "--out", tmp_path / "lat")
    assert_one_line_error(code, err, "--vae")
    np.savez(tmp_path / "few.npz", arr_0=np.zeros((5, 8, 8, 1), np.uint8))
    code, _, err = run(capsys, "fid", tmp_path / "few.npz", "--ref", "digits", "--inception-weights", tmp_path / "nope.pth")
    assert_one_line_error(code, err, "--inception-weights")
    # fewer samples than FID needs
    code, _, err = run(capsys, "fid", tmp_path / "few.npz", "--ref", "digits", "--proxy", "--ref-out", tmp_path / "r.pt",
                       "--no-progress")
    assert_one_line_error(code, err, "samples")
    # a reference of another resolution (refused from the headers, before the proxy is trained: issue 23.8)
    np.savez(tmp_path / "big.npz", arr_0=np.zeros((300, 16, 16, 1), np.uint8))
    code, _, err = run(capsys, "fid", tmp_path / "big.npz", "--ref", "digits", "--proxy", "--no-progress")
    assert_one_line_error(code, err, "8x8")


def test_latents_round_trip_with_a_local_vae(tmp_path, capsys):
    diffusers = pytest.importorskip("diffusers")
    vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                                  up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8), latent_channels=4,
                                  norm_num_groups=4, sample_size=8)
    vae.save_pretrained(tmp_path / "vae")
    code, out, err = run(capsys, "latents", "--vae", tmp_path / "vae", "--data", "digits", "--img-size", 8,
                         "--out", tmp_path / "lat", "--no-progress")
    assert code == 0, err
    blob = torch.load(tmp_path / "lat" / "train.pt", weights_only=True)
    assert blob["latents"].shape[1:] == (4, 4, 4) and len(blob["latents"]) == len(blob["labels"])
    cfg = load_config("sit-tiny-fmnist", ["data.name=latents", f"data.path={tmp_path / 'lat'}", "model.in_chans=4",
                                          "model.img_size=4", "model.patch_size=2", "model.embed_dim=32", "model.depth=2",
                                          "model.num_heads=2", "train.epochs=1", "train.batch_size=64",
                                          f"train.out_dir={tmp_path / 'run'}"])
    summary = train(cfg, progress=False)
    assert np.isfinite(summary["final_loss"])
    code, _, err = run(capsys, "sample", summary["checkpoint"], "--n", 2, "--steps", 2, "--out", tmp_path / "s")
    assert_one_line_error(code, err, "--vae")
    code, _, err = run(capsys, "sample", summary["checkpoint"], "--n", 3, "--steps", 2, "--vae", tmp_path / "vae",
                       "--out", tmp_path / "s", "--no-progress")
    assert code == 0, err
    assert np.load(next((tmp_path / "s").glob("*.npz")))["arr_0"].shape == (3, 8, 8, 3)


@pytest.mark.slow
def test_torchrun_sampling_splits_n_across_ranks(diffusion_runs, tmp_path):
    """Two CPU ranks (gloo) share N = 5 samples: rank r draws samples r, r+2, ... with seed + r; rank 0
    writes all 5, in order, with no sample doubled."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29557", "-m", "resdecay",
           "sample", diffusion_runs["uvit"], "--num-samples", "5", "--steps", "3", "--device", "cpu", "--out", str(tmp_path), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    arr = np.load(next(tmp_path.glob("*.npz")))["arr_0"]
    assert arr.shape == (5, 8, 8, 1)
    assert len({a.tobytes() for a in arr}) == 5
    assert json.loads(next(tmp_path.glob("*.json")).read_text())["world_size"] == 2
