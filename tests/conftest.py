"""Shared fixtures: tiny fake datasets written on the fly, and a tiny run config."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from resdecay.io import atomic_save

from helpers import TINY, write_idx

@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """The pixel-baseline cache ($XDG_CACHE_HOME/resdecay) of the tests lives in a temporary folder, shared by
    the session (so the ablate tests reuse it) and never the developer's own."""
    import os
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(autouse=True)
def _threads(monkeypatch):
    torch.set_num_threads(2)
    monkeypatch.setenv("WANDB_MODE", "offline")  # train.loggers=[wandb] never reaches a network in the tests


@pytest.fixture
def tiny_overrides(tmp_path):
    """Overrides that make mae-tiny-digits a seconds-long run writing into tmp_path/run."""
    return [*TINY, f"train.out_dir={tmp_path / 'run'}"]


@pytest.fixture
def fake_fmnist(tmp_path):
    root = tmp_path / "fmnist"
    root.mkdir()
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 96), ("t10k", 32)):
        write_idx(root / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    return root


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


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """Two short digits runs (decayed and plain) shared by the evaluation tests."""
    from resdecay.train.config import load_config
    from resdecay.train import train

    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name, preset in (("decayed", "mae-tiny-digits"), ("plain", "mae-tiny-digits-plain")):
        cfg = load_config(preset, [*TINY, "train.epochs=2", f"train.out_dir={root / name}"])
        out[name] = train(cfg, progress=False)["checkpoint"]
    return out


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests need CUDA: skipped (not failed) where there is none, so a plain run stays green."""
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
def diffusion_proxy_cache(tmp_path_factory, monkeypatch):
    """Proxy FID extractors are cached under $XDG_CACHE_HOME: the diffusion tests keep theirs in the session's
    temporary folder, out of the home folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.getbasetemp() / "cache"))
