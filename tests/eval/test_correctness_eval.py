"""Issue 23, the evaluation commands: ``fid`` of two image sets, every input of ``fid`` / ``eval`` /
``eval-diffusion`` / ``sample`` checked before the expensive work, and ``eval`` on a read-only run, a
full disk, a diffusion checkpoint, a data path the data set ignores and a run that skips bad files.

Each test fails on the code before the fix (the item it covers is named in its docstring).
"""

from __future__ import annotations

import errno
import json
import shutil

import numpy as np
import pytest
import torch

from helpers import TINY, assert_one_line_error, model_overrides, run, seed_proxy_cache
from helpers import train_online as train
from resdecay.eval.features import source as features_source
from resdecay.eval.fid import feature_stats, fid, proxy_extractor, reference_images
from resdecay.eval.fid import proxy as fidmod
from resdecay.train.config import load_config

FAST = ["--no-progress", "--evals", "knn", "--no-baselines"]
UVIT = ["data.name=digits", *model_overrides("uvit", keys=("img_size", "patch_size", "embed_dim", "num_heads", "depth"),
                                              depth=3),
        "train.epochs=1", "train.batch_size=64", "train.warmup_epochs=0", "train.threads=1"]


@pytest.fixture(scope="module")
def xdg(tmp_path_factory, digits_proxy):
    """A proxy FID cache of this module's own ($XDG_CACHE_HOME) holding the session's digits proxy."""
    root = tmp_path_factory.mktemp("xdg")
    seed_proxy_cache(digits_proxy, root / "resdecay" / "fid")
    return root


@pytest.fixture
def no_training(monkeypatch, tmp_path):
    """An empty proxy cache and a proxy trainer that fails: a command that trains the proxy fails the test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))

    def trainer(*args, **kwargs):
        raise AssertionError("the proxy network was trained before the inputs were checked")

    monkeypatch.setattr(fidmod, "_train_proxy", trainer)


@pytest.fixture(scope="module")
def digit_sets(tmp_path_factory):
    """Two halves of the digits training split, each as an ADM .npz and as a folder of PNG files."""
    from PIL import Image

    root = tmp_path_factory.mktemp("sets")
    d = reference_images("digits", "train").permute(0, 2, 3, 1).numpy()  # uint8 NHWC
    for name, arr in (("a", d[:700]), ("b", d[700:])):
        np.savez(root / f"{name}.npz", arr_0=arr)
        (root / name.upper()).mkdir()
        for i, im in enumerate(arr):
            Image.fromarray(im[..., 0]).save(root / name.upper() / f"{i:05d}.png")
    np.savez(root / "few.npz", arr_0=d[:5])
    np.savez(root / "big.npz", arr_0=np.zeros((300, 16, 16, 1), np.uint8))
    (root / "empty").mkdir()
    return root


@pytest.fixture(scope="module")
def uvit_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("uvit")
    return train(load_config("uvit-tiny-fmnist", [*UVIT, f"train.out_dir={root / 'run'}"]), progress=False)["checkpoint"]


def _value(out: str) -> float:
    return float(out.splitlines()[0].rsplit(":", 1)[1])


# ----------------------------------------------------------------------------- 23.8: fid
def test_fid_compares_two_image_sets(capsys, monkeypatch, xdg, digit_sets):
    """Issue 23.8: ``fid A.npz B.npz`` and ``fid dirA dirB`` (pytorch-fid's first command) work, give
    the library's value, read PNG folders exactly as the .npz, and the card names both sources."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    s = digit_sets
    code, out, err = run(capsys, "fid", str(s / "a.npz"), str(s / "b.npz"), "--proxy", "--data", "digits", "--no-progress")
    assert code == 0, err
    value = _value(out)
    card = json.loads(out.split("\n", 1)[1])
    assert (card["samples"], card["reference"], card["reference_kind"]) == (str(s / "a.npz"), str(s / "b.npz"), "images")
    assert card["n_samples"] == 700 and card["n_ref"] == 737 and card["extractor"].startswith("proxy-cnn-digits-8px@")
    ext = proxy_extractor("digits", cache_dir=xdg / "resdecay" / "fid")
    st = {k: feature_stats(str(s / f"{k}.npz"), ext, batch_size=200) for k in "ab"}
    assert value == pytest.approx(fid(st["a"], st["b"]), abs=5e-5)  # the CLI prints 4 decimals
    assert 0 < value < 5  # two halves of one data set are close
    code, out, err = run(capsys, "fid", str(s / "A"), str(s / "B"), "--proxy", "--data", "digits", "--no-progress")
    assert code == 0 and _value(out) == value, err  # PNG is lossless: the same images, the same number
    code, out, _ = run(capsys, "fid", str(s / "B"), str(s / "a.npz"), "--proxy", "--data", "digits", "--no-progress")
    assert code == 0 and _value(out) == pytest.approx(value, abs=2e-4)  # symmetric
    code, out, _ = run(capsys, "fid", str(s / "A"), "--ref", str(s / "a.npz"), "--proxy", "--data", "digits",
                       "--ref-out", str(s / "a_stats.pt"), "--no-progress")
    assert code == 0 and abs(_value(out)) < 1e-4  # --ref takes an image set too; its stats can be kept
    code, _, err = run(capsys, "fid", str(s / "b.npz"), "--ref", str(s / "a_stats.pt"), "--proxy", "--no-progress")
    assert_one_line_error(code, err, "names no dataset", "--data")  # stats of an image set: say which proxy
    code, out, err = run(capsys, "fid", str(s / "b.npz"), "--ref", str(s / "a_stats.pt"), "--proxy", "--data", "digits",
                         "--no-progress")
    assert code == 0 and _value(out) == pytest.approx(value, abs=2e-4), err


@pytest.mark.parametrize("args,needles", [
    (["few.npz", "--ref", "digits", "--proxy", "--ref-out", "{tmp}/r.pt"], ["the samples have 5 images", "at least 129"]),
    (["few.npz", "b.npz", "--proxy", "--data", "digits"], ["the samples have 5 images"]),
    (["a.npz", "few.npz", "--proxy", "--data", "digits"], ["the reference have 5 images"]),
    (["big.npz", "--ref", "digits", "--proxy"], ["8x8x1", "16x16x1"]),
    (["big.npz", "b.npz", "--proxy", "--data", "digits"], ["8x8x1", "16x16x1"]),
    (["a.npz", "b.npz", "--proxy"], ["--proxy needs the dataset", "--data"]),
    (["a.npz", "b.npz", "--proxy", "--data", "imagefolder"], ["--data names the proxy"]),
    (["a.npz", "b.npz", "{tmp}"], ["two image sets at most"]),
    (["a.npz", "b.npz", "--ref", "digits", "--proxy"], ["drop --ref"]),
    (["a.npz", "--proxy"], ["FID needs a reference", "fid A.npz B.npz"]),
    (["a.npz", "--ref", "digits", "--proxy", "--img-size", "32"], ["--img-size", "imagefolder only"]),
    (["a.npz", "--ref", "digits", "--proxy", "--data-path", "{tmp}"], ["digits is built in", "would be ignored"]),
    (["a.npz", "--ref", "digits", "--proxy", "--data", "cifar10"], ["--data cifar10 contradicts --ref digits"]),
    (["a.npz", "empty", "--proxy", "--data", "digits"], ["holds no image files"]),
    (["a.npz", "--ref", "imagefolder", "--proxy"], ["--ref imagefolder needs --data-path"]),
    (["a.npz", "missing.npz", "--proxy", "--data", "digits"], ["no samples file or folder"]),
    (["a.npz", "--ref", "digits", "--proxy", "--ref-out", "{file}/r.pt"], ["is not writable", "--ref-out"]),
    (["a.npz", "b.npz", "--inception-weights", "{tmp}/nope.pth"], ["Inception weights not found", "--inception-weights"]),
])
def test_fid_checks_every_input_before_training_the_proxy(capsys, tmp_path, no_training, digit_sets, args, needles):
    """Issue 23.8: every bad input of ``fid`` is one line, found before the proxy network is trained
    (the trainer fails the test if called) or a reference is built (no --ref-out file appears)."""
    (tmp_path / "a-file").write_text("x")
    argv = [a.format(tmp=tmp_path, file=tmp_path / "a-file") for a in args]
    argv = [str(digit_sets / a) if (digit_sets / a).exists() or a == "missing.npz" else a for a in argv]
    assert_one_line_error(*run(capsys, "fid", *argv)[::2], *needles)
    assert not (tmp_path / "r.pt").exists()


# ----------------------------------------------------------------------------- 23.12/13: eval
def test_eval_of_a_diffusion_checkpoint_points_to_eval_diffusion(capsys, tmp_path, tiny_checkpoints, uvit_checkpoint):
    """Issue 23.12/13: ``eval`` of a U-ViT checkpoint, alone or beside an MAE one, was an
    AttributeError; now one line naming ``eval-diffusion``, before the MAE is evaluated."""
    out = tmp_path / "o"
    assert_one_line_error(*run(capsys, "eval", uvit_checkpoint, *FAST, "--out", str(out))[::2],
                          "uvit diffusion model", f"resdecay eval-diffusion {uvit_checkpoint}")
    assert_one_line_error(*run(capsys, "eval", tiny_checkpoints["decayed"], uvit_checkpoint, *FAST, "--out", str(out))[::2],
                          "eval-diffusion")
    assert not list(out.glob("*/eval.json"))  # refused before the first checkpoint's evaluation


def test_eval_data_path_of_a_built_in_data_set_is_refused(capsys, tmp_path, tiny_checkpoints, uvit_checkpoint,
                                                           fake_imagefolder):
    """Issue 23.13: ``eval --data-path`` was silently ignored for digits (the numbers were digits');
    now one line, for eval, eval-diffusion and figures, with and without --data."""
    ck, folder = tiny_checkpoints["decayed"], str(fake_imagefolder)
    for extra in ([], ["--data", "digits"]):
        assert_one_line_error(*run(capsys, "eval", ck, *FAST, *extra, "--data-path", folder, "--out", str(tmp_path))[::2],
                              "digits is built in", "--data imagefolder --data-path")
    assert_one_line_error(*run(capsys, "eval-diffusion", uvit_checkpoint, "--data", "digits", "--data-path", folder)[::2],
                          "digits is built in")
    for extra in ([], ["--data", "digits"]):  # figures read the same way
        assert_one_line_error(*run(capsys, "figures", ck, *extra, "--data-path", folder, "--out", str(tmp_path))[::2],
                              "digits is built in")


def _no_extraction(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("features were extracted before the inputs were checked")

    monkeypatch.setattr(features_source, "extract_block_features", fail)


def test_eval_unwritable_out_is_one_line_before_any_extraction(capsys, tmp_path, tiny_checkpoints, monkeypatch):
    """Issue 23.12: an unwritable --out (here a path through a file, which even root cannot create)
    was a traceback after the features were extracted; now one line first."""
    _no_extraction(monkeypatch)
    (tmp_path / "a-file").write_text("x")
    code, _, err = run(capsys, "eval", tiny_checkpoints["decayed"], *FAST, "--out", str(tmp_path / "a-file" / "out"),
                       "--cache-dir", str(tmp_path / "cache"))
    assert_one_line_error(code, err, "is not writable", "--out")


def _read_only_run(tmp_path, checkpoint):
    """A copy of a run whose eval/ folder cannot be created (a file stands in its place): what a
    read-only run folder looks like to the evaluation, also under root, where chmod does not bind."""
    run_dir = tmp_path / "someone-elses-run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(checkpoint, run_dir / "checkpoints" / "step_00000001.pt")
    (run_dir / "eval").write_text("not a folder")
    return run_dir / "checkpoints" / "step_00000001.pt"


def test_eval_of_a_read_only_run_still_gives_numbers(capsys, tmp_path, tiny_checkpoints):
    """Issue 23.12: a read-only run folder ended in a traceback when the feature cache was written;
    now the numbers come with one warning (the cache is only a cache), and the default report folder
    inside the run is refused up front in one line naming --out."""
    ck = _read_only_run(tmp_path, tiny_checkpoints["decayed"])
    code, out, err = run(capsys, "eval", str(ck), *FAST, "--out", str(tmp_path / "mine"))
    assert code == 0, err
    warnings = [ln for ln in err.splitlines() if ln.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("resdecay: warning: feature cache") and "not writable" in warnings[0]
    report = json.loads((tmp_path / "mine" / "someone-elses-run" / "eval.json").read_text())
    assert 0 <= report["results"][0]["values"]["top1"] <= 1 and report["cache"]["written"] is False
    assert "knn" in out and "not written" in out
    assert_one_line_error(*run(capsys, "eval", str(ck), *FAST)[::2], "is not writable", "pass --out DIR")


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4096 vs 0")])
def test_eval_with_a_full_disk_warns_naming_the_cache_file(capsys, tmp_path, tiny_checkpoints, monkeypatch, failure):
    """Issue 23.12: a full disk while the eval cache was written was a traceback (OSError, or torch's
    RuntimeError 'unexpected pos'); now one warning naming the file and the space, and the numbers."""
    def full_disk(obj, f, *args, **kwargs):
        raise failure

    monkeypatch.setattr(torch, "save", full_disk)
    code, out, err = run(capsys, "eval", tiny_checkpoints["plain"], *FAST, "--out", str(tmp_path / "o"),
                         "--cache-dir", str(tmp_path / "cache"))
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("resdecay: warning: no space left on the device while writing "), err
    assert str(tmp_path / "cache" / "train-") in lines[0] and "needs about" in lines[0] and "free there" in lines[0]
    assert not list((tmp_path / "cache").glob("*.pt")) and not list((tmp_path / "cache").glob(".*tmp*"))
    assert json.loads(next((tmp_path / "o").glob("*/eval.json")).read_text())["results"]


def test_eval_applies_the_runs_skip_policy_to_unreadable_images(capsys, tmp_path, fake_imagefolder):
    """Issue 23.12: ``eval`` of a run trained with data.on_bad_file=skip stopped at the first bad file;
    now it applies the run's policy (the next readable image stands in, as in training), lists the
    files, and the data cards say how many were replaced, also when the features come from the cache."""
    cfg = load_config("mae-tiny-digits", [*TINY, "data.name=imagefolder", f"data.path={fake_imagefolder}",
                                          "model.img_size=16", "model.patch_size=4", "model.in_chans=3",
                                          "data.on_bad_file=skip", "train.batch_size=4", "train.epochs=1",
                                          "train.warmup_epochs=0", "train.threads=1", f"train.out_dir={tmp_path / 'run'}"])
    ck = train(cfg, progress=False)["checkpoint"]
    for bad in (fake_imagefolder / "train" / "cat" / "1.png", fake_imagefolder / "val" / "dog" / "0.png"):
        bad.write_bytes(b"not an image")
    out = tmp_path / "o"
    args = ["eval", ck, "--no-progress", "--evals", "knn", "--k", "3", "--out", str(out), "--cache-dir", str(tmp_path / "c")]
    code, text, err = run(capsys, *args)  # with the baselines: pixels and the random encoder read the images too
    assert code == 0, err
    report = json.loads((out / "run" / "eval.json").read_text())
    card = report["results"][0]["protocol"]
    assert (card["train"]["unreadable_replaced"], card["test"]["unreadable_replaced"]) == (1, 1)
    assert (card["train"]["images"], card["test"]["images"]) == (12, 4)
    assert (out / "run" / "bad_files_train.txt").read_text().startswith(str(fake_imagefolder / "train" / "cat" / "1.png"))
    assert "1 train and 1 test image(s) were unreadable" in text
    (out / "run" / "bad_files_train.txt").unlink()
    code, text, err = run(capsys, *args, "--no-baselines")  # features from the cache: the lists come back with them
    assert code == 0 and "train hit, test hit" in text, err
    assert json.loads((out / "run" / "eval.json").read_text())["results"][0]["protocol"] == card
    assert "cat/1.png" in (out / "run" / "bad_files_train.txt").read_text()


# ----------------------------------------------------------------------------- 23.8: sample, eval-diffusion
def test_sample_and_eval_diffusion_check_inputs_before_the_work(capsys, tmp_path, uvit_checkpoint, monkeypatch):
    """Issue 23.8: ``sample`` and ``eval-diffusion`` wrote their output folder only after sampling /
    probing (an unwritable --out was a traceback at the end); every input is now checked first."""
    from resdecay.commands import evaluate, sample

    def fail(*args, **kwargs):
        raise AssertionError("the expensive part ran before the inputs were checked")

    monkeypatch.setattr(sample, "sample", fail)
    monkeypatch.setattr(evaluate, "probe_grid", fail)
    (tmp_path / "a-file").write_text("x")
    blocked = str(tmp_path / "a-file" / "out")
    ck = uvit_checkpoint
    assert_one_line_error(*run(capsys, "sample", ck, "--n", "2", "--out", blocked)[::2], "is not writable", "--out")
    assert_one_line_error(*run(capsys, "sample", ck, "--n", "2", "--batch-size", "0", "--out", str(tmp_path))[::2],
                          "--batch-size")
    assert_one_line_error(*run(capsys, "sample", ck, "--n", "2", "--vae", str(tmp_path), "--out", str(tmp_path))[::2],
                          "trained on pixels", "drop --vae")
    assert_one_line_error(*run(capsys, "eval-diffusion", ck, "--out", blocked, "--no-progress")[::2], "is not writable")
    assert_one_line_error(*run(capsys, "eval-diffusion", ck, "--max-train", "0", "--out", str(tmp_path))[::2],
                          "--max-train must be a positive integer")
    assert_one_line_error(*run(capsys, "eval-diffusion", ck, "--noise-levels", "0,2", "--out", str(tmp_path))[::2],
                          "noise levels must lie in [0, 1]")
