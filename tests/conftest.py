"""Shared fixtures: tiny fake datasets written on the fly, and a tiny run config."""

from __future__ import annotations

import ast
import functools
import gc
import os
import pickle
import shutil
import sys
from pathlib import Path

# Bytecode caches on, even where PYTHONDONTWRITEBYTECODE turns them off (set before the imports below): the suite
# starts ~100 interpreters (torchrun ranks, CLI and benchmark runs), and without a cache each compiles every resdecay
# module it imports again (~0.5 s of a 2-core machine each); site-packages were compiled when they were installed.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

import numpy as np
import pytest
import torch

from helpers import CPUS, THREADS, TINY, WORKERS, seed_proxy_cache, write_idx
from resdecay.io import atomic_save

# Full (generation 2) garbage collections at most once per 1,000 young ones in the test processes (CPython's
# default: 10). A worker holds torch, transformers, diffusers and timm, so each full walk of its heap takes ~1.5 s;
# with the default, automatic ones cost each of the two workers ~17 s of a suite run, with this ~4 s (gc.callbacks
# timings of one `-n auto` run each way), for ~0.4 GB more peak memory per worker. Cycles still die at the next full
# collection, and explicit gc.collect() calls (the benchmarks' memory rows) are unchanged.
gc.set_threshold(gc.get_threshold()[0], gc.get_threshold()[1], 1000)

# The processes a test starts (torchrun, the CLI in a subprocess) inherit a worker's share of the CPUs
# (helpers.THREADS) unless the test sets its own: torch would take every core in each of them.
if WORKERS:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(THREADS)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, called for -n auto
def pytest_xdist_auto_num_workers(config):
    """One worker per CPU this process may run on. xdist's own count is the physical cores: one worker on a
    2-vCPU machine whose vCPUs are the two threads of one core, where two workers still finish sooner than one.
    PYTEST_XDIST_AUTO_NUM_WORKERS, when set, still decides (xdist's own hook reads it)."""
    return None if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") else CPUS


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: who runs which test under -n
def pytest_xdist_make_scheduler(config, log):
    """xdist's default (``load``) hands out single tests, so the tests of a module whose own fixture outlives one
    test (a trained run, a built model, a workspace) land on every worker, and each worker builds it again. Such a
    module goes to one worker whole; every other test is still handed out alone. The modules go out first, the
    largest first (xdist's --loadscope-reorder), so no long module starts last while the other worker idles.
    (``--dist loadgroup`` with xdist_group marks would do the first part, but it cannot rename a test's id under
    pytest 9.) Another ``--dist`` given on the command line is left to xdist."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixturesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::")[0]
            return path if shares_fixtures(config.rootpath / path) else nodeid

    return SharedFixturesTogether(config, log)


@functools.cache
def shares_fixtures(path: Path) -> bool:
    """Whether the test module at ``path`` defines a fixture of a scope wider than one test."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and any(
                        k.arg == "scope" and not (isinstance(k.value, ast.Constant) and k.value.value == "function")
                        for k in dec.keywords):
                    return True
    return False


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


def once_per_run(tmp_path_factory, name: str, build):
    """``build(folder)``'s result (``folder`` a new empty folder), built once for the whole test run. Under xdist the
    first worker to ask builds it in a folder every worker sees (the run's base temporary folder) while the others
    wait on a lock, then read its result back, instead of each worker training the same thing again."""
    if not WORKERS:
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock  # a dependency of torch's

    root = tmp_path_factory.getbasetemp().parent  # this run's, shared by its workers (theirs are popen-gwN in it)
    result = root / f"{name}.pickle"
    with FileLock(root / f"{name}.lock"):
        if not result.is_file():
            shutil.rmtree(root / name, ignore_errors=True)  # what a worker that failed to build it left
            (root / name).mkdir()
            value = build(root / name)
            result.write_bytes(pickle.dumps(value))
        return pickle.loads(result.read_bytes())


# Trained tiny runs shared by the session: each is trained once, on first use, instead of once per test (and once
# for all xdist workers). They are read-only: a test that resumes a run or writes into its folder works on a copy
# (helpers.copy_run). Every worker trains with the same threads (helpers.THREADS), so whichever worker trained
# one, it has the bits of a run trained inside a test.
@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """Two short digits runs (decayed and plain): ``load_config(preset, [*TINY, f"train.out_dir=..."])``,
    2 epochs of 22 steps, exactly the run a test would train with the ``tiny_overrides`` fixture."""
    from resdecay.train import train
    from resdecay.train.config import load_config

    def build(root):
        torch.set_num_threads(THREADS)  # as every test runs (_threads): the same bits as a run trained inside a test
        out = {}
        for name, preset in (("decayed", "mae-tiny-digits"), ("plain", "mae-tiny-digits-plain")):
            cfg = load_config(preset, [*TINY, "train.epochs=2", f"train.out_dir={root / name}"])
            out[name] = train(cfg, progress=False)["checkpoint"]
        return out

    return once_per_run(tmp_path_factory, "ckpts", build)


@pytest.fixture(scope="session")
def tiny_fmnistm_checkpoint(tmp_path_factory):
    """A short U-Net MAE run on Fashion-MNIST-M built from the fake garments of ``fake_fmnist`` (seconds)."""
    from resdecay.train import train
    from resdecay.train.config import load_config

    def build(root):
        torch.set_num_threads(THREADS)
        fmnist = write_fake_fmnist(root / "fmnist")
        cfg = load_config("mae-tiny-fmnistm", [*TINY, "train.epochs=1", "train.batch_size=48",
                                               f"train.out_dir={root / 'run'}", f"data.path={fmnist}"])
        return train(cfg, progress=False)["checkpoint"]

    return once_per_run(tmp_path_factory, "fmnistm", build)


@pytest.fixture(scope="session")
def digits_proxy(tmp_path_factory) -> Path:
    """The digits proxy FID extractor's cache file, trained once for the session. A test that needs the proxy in
    a cache folder of its own copies the file there (helpers.seed_proxy_cache) instead of training it again."""
    from resdecay.eval.fid import proxy_extractor

    def build(cache):
        torch.set_num_threads(THREADS)
        proxy_extractor("digits", cache_dir=cache)
        (path,) = cache.glob("proxy-cnn-digits-8px-*.pt")
        return path

    return once_per_run(tmp_path_factory, "digits-proxy", build)


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
