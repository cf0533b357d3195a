"""Shared fixtures: tiny fake datasets written on the fly, and a tiny run config."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import TINY, seed_proxy_cache, write_idx
from resdecay.io import atomic_save

# README's test command spreads the tests over the cores with pytest-xdist (-n auto): one worker process per core,
# each with the cores it may call its own (one on a 2-core machine), since two workers of two threads each on two
# cores lose more to the threads waiting on each other than the second thread gains on these tiny models. The
# processes a test starts (torchrun, the CLI in a subprocess) inherit that count, unless the test sets its own. A
# plain run (no -n) is alone on the machine and keeps two threads.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
THREADS = max(1, min(2, (os.cpu_count() or 1) // WORKERS)) if WORKERS else 2
if WORKERS:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(THREADS)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """The pixel-baseline cache ($XDG_CACHE_HOME/resdecay) of the tests lives in a temporary folder, shared by
    the session (so the ablate tests reuse it) and never the developer's own."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    torch.set_num_threads(THREADS)
    monkeypatch.setenv("WANDB_MODE", "offline")  # train.loggers=[wandb] never reaches a network in the tests


@pytest.fixture
def tiny_overrides(tmp_path):
    """Overrides that make mae-tiny-digits a seconds-long run writing into tmp_path/run."""
    return [*TINY, f"train.out_dir={tmp_path / 'run'}"]


def write_fake_fmnist(root: Path) -> Path:
    """A Fashion-MNIST folder of random garments: 96 train and 32 test images, labels 0..9 in turn."""
    root.mkdir()
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 96), ("t10k", 32)):
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return root


@pytest.fixture
def fake_fmnist(tmp_path):
    return write_fake_fmnist(tmp_path / "fmnist")


@pytest.fixture
def fake_cifar10(tmp_path):
    root = tmp_path / "cifar"
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)

    def batch(n):
        return {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": list(np.arange(n) % 10)}

    for i in range(1, 6):
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump(batch(8), f)
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(batch(8), f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return root


@pytest.fixture
def fake_imagefolder(tmp_path):
    from PIL import Image

    root = tmp_path / "imnet"
    rng = np.random.default_rng(0)
    for split, n in (("train", 6), ("val", 2)):
        for cls in ("cat", "dog"):
            d = root / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(d / f"{i}.png")
    return root


# Trained tiny runs shared by the session: each is trained once, on first use, instead of once per test. They
# are read-only: a test that resumes a run or writes into its folder works on a copy (helpers.copy_run).
@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """Two short digits runs (decayed and plain): ``load_config(preset, [*TINY, f"train.out_dir=..."])``,
    2 epochs of 22 steps, exactly the run a test would train with the ``tiny_overrides`` fixture."""
    from resdecay.train import train
    from resdecay.train.config import load_config

    torch.set_num_threads(THREADS)  # as every test runs (_threads): the same bits as a run trained inside a test
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name, preset in (("decayed", "mae-tiny-digits"), ("plain", "mae-tiny-digits-plain")):
        cfg = load_config(preset, [*TINY, "train.epochs=2", f"train.out_dir={root / name}"])
        out[name] = train(cfg, progress=False)["checkpoint"]
    return out


@pytest.fixture(scope="session")
def tiny_fmnistm_checkpoint(tmp_path_factory):
    """A short U-Net MAE run on Fashion-MNIST-M built from the fake garments of ``fake_fmnist`` (seconds)."""
    from resdecay.train import train
    from resdecay.train.config import load_config

    torch.set_num_threads(THREADS)
    root = tmp_path_factory.mktemp("fmnistm")
    fmnist = write_fake_fmnist(root / "fmnist")
    cfg = load_config("mae-tiny-fmnistm", [*TINY, "train.epochs=1", "train.batch_size=48",
                                           f"train.out_dir={root / 'run'}", f"data.path={fmnist}"])
    return train(cfg, progress=False)["checkpoint"]


@pytest.fixture(scope="session")
def digits_proxy(tmp_path_factory) -> Path:
    """The digits proxy FID extractor's cache file, trained once for the session. A test that needs the proxy in
    a cache folder of its own copies the file there (helpers.seed_proxy_cache) instead of training it again."""
    from resdecay.eval.fid import proxy_extractor

    torch.set_num_threads(THREADS)
    cache = tmp_path_factory.mktemp("digits-proxy")
    proxy_extractor("digits", cache_dir=cache)
    (path,) = cache.glob("proxy-cnn-digits-8px-*.pt")
    return path


E2E = Path(__file__).resolve().parent / "e2e"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    """Everything under tests/e2e/ (documented commands, benchmark and demo runs, kill -9, torchrun) is ``slow``:
    ``pytest -m "not slow"`` is the fast tier. ``gpu`` tests need CUDA: skipped (not failed) where there is none,
    so a plain run stays green."""
    slow = pytest.mark.slow
    for item in items:
        if E2E in Path(item.fspath).resolve().parents:
            item.add_marker(slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake_latents(tmp_path):
    """A cached-latents folder (data.name=latents): 6 train and 2 test zero latents of shape 4x4x4, two classes."""
    root = tmp_path / "latents"
    root.mkdir()
    for split, n in (("train", 6), ("test", 2)):
        atomic_save({"latents": torch.zeros(n, 4, 4, 4, dtype=torch.float16), "labels": torch.arange(n) % 2,
                     "meta": {"num_classes": 2}}, root / f"{split}.pt")
    return root


@pytest.fixture
def diffusion_proxy_cache(tmp_path_factory, monkeypatch, digits_proxy):
    """Proxy FID extractors are cached under $XDG_CACHE_HOME: the diffusion tests keep theirs in the session's
    temporary folder, out of the home folder, where the session's digits proxy already lies."""
    xdg = tmp_path_factory.getbasetemp() / "cache"
    seed_proxy_cache(digits_proxy, xdg / "resdecay" / "fid")
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    return 3
