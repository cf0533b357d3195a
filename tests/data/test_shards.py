"""Issue 34.1: sharded inputs. WebDataset tar shards (data.name=wds) and a Hugging Face datasets folder
(data.name=hf), built at test time from scikit-learn's digits, read the same images and labels as the
same data written as an ImageFolder; pretraining, eval, the linear probe and check-data run from them;
a 2-process torchrun splits them with no sample twice; bad input is refused in one line."""

from __future__ import annotations

import hashlib
import io
import json
import os
import runpy
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import TINY, assert_one_line_error, free_port, run
from resdecay.commands.shard import run_shard
from resdecay.data import DataConfig, build_dataset
from resdecay.data.digits import load_digits_split
from resdecay.data.hf_export import save_hf_dataset
from resdecay.data.shards import expand_braces
from resdecay.train import train
from resdecay.train.config import load_config

N = 120  # images of each split
SMALL = [*TINY, "model.in_chans=3", "train.epochs=1", "train.warmup_epochs=0", "train.batch_size=32", "train.threads=1"]


def write_digits_folder(root: Path, limit: int) -> Path:
    """The first ``limit`` digits of each split as an ImageFolder (8-bit grey PNGs, as save_hf_dataset encodes them)."""
    for split, folder in (("train", "train"), ("test", "val")):
        images, labels = load_digits_split(split == "train")
        for i, (img, label) in enumerate(zip(images[:limit], labels[:limit], strict=True)):
            d = root / folder / str(int(label))
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(img[0].numpy()).save(d / f"{i:05d}.png")
    return root


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same digits as an ImageFolder, as tar shards (`resdecay shard`, 50 a shard) and as a datasets folder."""
    root = tmp_path_factory.mktemp("shards")
    folder = write_digits_folder(root / "folder", N)
    written = run_shard(str(folder), str(root / "shards"), shard_size=50, progress=False)
    hf = save_hf_dataset("digits", root / "hf", limit=N)
    return {"root": root, "folder": folder, "shards": root / "shards", "hf": hf, "written": written}


def items(ds, seed_each: bool = False) -> list[tuple[bytes, int]]:
    out = []
    for i in range(len(ds)):
        if seed_each:
            torch.manual_seed(i)  # the same random crop for item i of either data set
        x, y = ds[i]
        out.append((x.numpy().tobytes(), int(y)))
    return out


def test_expand_braces_and_shard_layout(sources):
    assert expand_braces("a-{008..011}.tar") == ["a-008.tar", "a-009.tar", "a-010.tar", "a-011.tar"]
    assert expand_braces("{x,y}-{1..2}") == ["x-1", "x-2", "y-1", "y-2"]
    assert [p.name for p in sources["written"]["train"]] == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert (sources["shards"] / "classes.txt").read_text().split() == [str(c) for c in range(10)]


@pytest.mark.parametrize("augment,decoder", [("none", "tensor"), ("mae", "tensor"), ("mae", "pil")])
def test_wds_items_are_the_image_folders_items(sources, augment, decoder):
    """Sample i of the shards is image i of the folder: same pixels, same label, same seeded crop."""
    pattern = str(sources["shards"] / "train-{000000..000002}.tar")
    for split in ("train", "test"):
        folder, finfo = build_dataset(DataConfig("imagefolder", path=str(sources["folder"]), augment=augment,
                                                 decoder=decoder), split, 8, augment=augment != "none")
        shards, sinfo = build_dataset(DataConfig("wds", path=pattern, val_path=str(sources["shards"] / "val-*.tar"),
                                                 augment=augment, decoder=decoder), split, 8, augment=augment != "none")
        assert len(shards) == len(folder) == N and sinfo.num_classes == finfo.num_classes == 10
        assert items(shards, True) == items(folder, True)
        assert (sinfo.mean, sinfo.std) == (finfo.mean, finfo.std)


def test_the_webdataset_library_reads_the_same_shards(sources):
    import webdataset as wds

    pattern = str(sources["shards"] / "train-{000000..000002}.tar")
    streamed = [(s["__key__"], int(s["cls"])) for s in wds.WebDataset(pattern, shardshuffle=False)]
    ours, _ = build_dataset(DataConfig("wds", path=pattern), "train", 8)
    assert [key for key, _ in streamed] == [f"{i:08d}" for i in range(N)]
    assert [label for _, label in streamed] == ours.targets


def test_hf_items_are_the_image_folders_items(sources, tmp_path, monkeypatch):
    """The datasets folder (and the same rows as parquet files) holds the folder's images and labels
    (in the data set's own order, so compared as sorted lists)."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    saved = datasets.load_from_disk(str(sources["hf"]))
    (tmp_path / "pq").mkdir()
    for split in ("train", "test"):
        saved[split].to_parquet(str(tmp_path / "pq" / f"{split}-00000-of-00001.parquet"))
    for split in ("train", "test"):
        folder, _ = build_dataset(DataConfig("imagefolder", path=str(sources["folder"])), split, 8)
        hf, info = build_dataset(DataConfig("hf", path=str(sources["hf"])), split, 8)
        pq, _ = build_dataset(DataConfig("hf", path=str(tmp_path / "pq")), split, 8)
        assert info.num_classes == 10 and len(hf) == len(pq) == N
        assert sorted(items(hf)) == sorted(items(folder))
        assert items(pq) == items(hf)


def _loss_rows(run_dir: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines()) if "loss" in r]


def _eval(capsys, ckpt, out, *extra) -> dict:
    code, text, err = run(capsys, "eval", str(ckpt), "--no-progress", "--evals", "knn,rank", "--k", "5",
                          "--no-baselines", "--out", str(out), *extra)
    assert code == 0, err
    report = json.loads(next(Path(out).glob("*/eval.json")).read_text())
    return {(r["metric"], r["feature"]): r["values"] for r in report["results"]}


def test_pretrain_eval_probe_and_check_data_from_shards(sources, tmp_path, capsys):
    """The same run from the shards and from the folder: the same losses, kNN and rank; then the
    linear probe and check-data read the shards too."""
    base = [*SMALL, "model.img_size=8"]
    runs = {}
    for name, data in (("folder", ["data.name=imagefolder", f"data.path={sources['folder']}"]),
                       ("wds", ["data.name=wds", f"data.path={sources['shards']}"])):
        cfg = load_config("mae-tiny-digits", [*base, *data, f"train.out_dir={tmp_path / name}"])
        runs[name] = train(cfg, progress=False)["checkpoint"]
    assert _loss_rows(tmp_path / "wds") == _loss_rows(tmp_path / "folder") and _loss_rows(tmp_path / "wds")
    wds_eval, folder_eval = _eval(capsys, runs["wds"], tmp_path / "ew"), _eval(capsys, runs["folder"], tmp_path / "ef")
    assert wds_eval == folder_eval and ("knn", "mean") in wds_eval

    code, text, err = run(capsys, "finetune", str(runs["wds"]), "--preset", "linprobe-mae", "--no-progress",
                          "train.epochs=1", "train.batch_size=32", "train.warmup_epochs=0", "train.threads=1",
                          "data.augment=none", f"train.out_dir={tmp_path / 'probe'}")
    assert code == 0, err
    assert f"on {N} wds test images" in text
    assert json.loads((tmp_path / "probe" / "eval.json").read_text())
    code, text, err = run(capsys, "finetune", str(runs["wds"]), "--preset", "finetune-mae", "--no-progress",  # the chain's end
                          "train.epochs=1", "train.batch_size=32", "train.warmup_epochs=0", "train.threads=1",
                          "model.mixup=0", "model.cutmix=0", f"train.out_dir={tmp_path / 'ft'}")
    assert code == 0, err
    assert f"on {N} wds test images" in text and (tmp_path / "ft" / "checkpoints" / "best.pt").is_file()

    code, text, err = run(capsys, "check-data", "--data", "wds", "--data-path", str(sources["shards"]), "--no-progress")
    assert code == 0, err
    assert f"check-data: train: {N} images, 0 unreadable" in text and f"check-data: test: {N} images, 0 unreadable" in text


def test_pretrain_and_eval_from_a_hf_folder(sources, tmp_path, capsys):
    """Pretraining reads the datasets folder; its checkpoint's kNN on the hf data equals its kNN on the
    same images read as an ImageFolder (the bank and queries are the same sets)."""
    cfg = load_config("mae-tiny-digits", [*SMALL, "model.img_size=8", "data.name=hf", f"data.path={sources['hf']}",
                                          f"train.out_dir={tmp_path / 'hf'}"])
    ckpt = train(cfg, progress=False)["checkpoint"]
    assert _loss_rows(tmp_path / "hf")
    own = _eval(capsys, ckpt, tmp_path / "e1")
    as_folder = _eval(capsys, ckpt, tmp_path / "e2", "--data", "imagefolder", "--data-path", str(sources["folder"]))
    assert own[("knn", "mean")] == pytest.approx(as_folder[("knn", "mean")], abs=1e-6)
    code, text, err = run(capsys, "check-data", "--data", "hf", "--data-path", str(sources["hf"]), "--no-progress")
    assert code == 0 and f"check-data: test: {N} images, 0 unreadable" in text, err
    for preset in ("linprobe-mae", "finetune-mae"):  # the rest of the chain reads the datasets folder too
        code, text, err = run(capsys, "finetune", str(ckpt), "--preset", preset, "--no-progress", "train.epochs=1",
                              "train.batch_size=32", "train.warmup_epochs=0", "train.threads=1", "model.mixup=0",
                              "model.cutmix=0", f"train.out_dir={tmp_path / preset}")
        assert code == 0, err
        assert f"on {N} hf test images" in text


DDP_SCRIPT = """
import hashlib, json, sys
from resdecay.train import distributed
from resdecay.train.config import load_config
from resdecay.train.setup import build_data

env = distributed.setup("cpu")
cfg = load_config("mae-tiny-digits", sys.argv[2:])
data = build_data(cfg, env)
seen = [hashlib.sha1(x.numpy().tobytes()).hexdigest() for images, _ in data.loader for x in images]
out = distributed.gather_objects(env, seen)
if env.is_main:
    json.dump(out, open(sys.argv[1], "w"))
distributed.cleanup(env)
"""


@pytest.mark.slow
def test_torchrun_splits_the_shards_with_no_sample_twice(sources, tmp_path):
    """2 processes (gloo, CPU), 2 DataLoader workers each: every training image of the shards comes out of
    exactly one rank, the same number on each (120 images = 2 ranks x 60, batches of 12)."""
    script, out = tmp_path / "ddp.py", tmp_path / "seen.json"
    script.write_text(DDP_SCRIPT)
    overrides = [*SMALL, "model.img_size=8", "data.name=wds", f"data.path={sources['shards']}", "data.num_workers=2",
                 "train.batch_size=12"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(script), str(out), *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    per_rank = json.loads(out.read_text())
    assert [len(seen) for seen in per_rank] == [N // 2, N // 2]
    assert not set(per_rank[0]) & set(per_rank[1])
    folder, _ = build_dataset(DataConfig("imagefolder", path=str(sources["folder"])), "train", 8)
    every = {hashlib.sha1(folder[i][0].numpy().tobytes()).hexdigest() for i in range(len(folder))}
    assert set(per_rank[0]) | set(per_rank[1]) == every


# ----------------------------------------------------------------------------- bad input
def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), 128, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _pretrain(capsys, tmp_path, *data):
    return run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *SMALL, "model.img_size=8",
               "train.batch_size=8", *data, f"train.out_dir={tmp_path / 'run'}")


def test_bad_shards_are_refused_in_one_line(tmp_path, capsys):
    code, _, err = _pretrain(capsys, tmp_path, "data.name=wds", f"data.path={tmp_path}/none-{{000000..000003}}.tar")
    assert_one_line_error(code, err, "matches no shard", "none-000000.tar")

    _tar(tmp_path / "a-000000.tar", {"0.png": _png(), "0.cls": b"1"})
    code, _, err = _pretrain(capsys, tmp_path, "data.name=wds", f"data.path={tmp_path}/a-{{000000..000001}}.tar")
    assert_one_line_error(code, err, "1 of 2 shards are missing", "a-000001.tar")

    _tar(tmp_path / "b.tar", {**{f"{i}.png": _png() for i in range(3)}, "0.cls": b"0", "2.cls": b"1"})
    code, _, err = _pretrain(capsys, tmp_path, "data.name=wds", f"data.path={tmp_path / 'b.tar'}")
    assert_one_line_error(code, err, f"shard {tmp_path / 'b.tar'}: sample '1' (1.png) has no .cls member")

    (tmp_path / "c.tar").write_bytes(b"not a tar at all" * 64)
    code, _, err = run(capsys, "check-data", "--data", "wds", "--data-path", str(tmp_path / "c.tar"), "--no-progress")
    assert_one_line_error(code, err, f"cannot read shard {tmp_path / 'c.tar'} as a plain tar")


def test_hf_without_the_named_columns_or_package(sources, tmp_path, capsys, monkeypatch):
    code, _, err = _pretrain(capsys, tmp_path, "data.name=hf", f"data.path={sources['hf']}", "data.image_column=img")
    assert_one_line_error(code, err, "has no column 'img' (columns: image, label)", "data.image_column=<name>")
    code, _, err = _pretrain(capsys, tmp_path, "data.name=hf", f"data.path={sources['hf']}", "data.label_column=y")
    assert_one_line_error(code, err, "has no column 'y'", "data.label_column=<name>")
    code, _, err = _pretrain(capsys, tmp_path, "data.name=hf", f"data.path={tmp_path / 'nowhere'}")
    assert_one_line_error(code, err, "is neither a `save_to_disk` folder nor parquet files")
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    code, _, err = _pretrain(capsys, tmp_path, "data.name=hf", f"data.path={sources['hf']}")
    assert_one_line_error(code, err, "needs the `datasets` package: pip install 'resdecay[shards]'")


def test_a_corrupt_member_stops_in_one_line_or_is_skipped_and_listed(tmp_path, capsys):
    """As for folders: the default stops naming shard:member; data.on_bad_file=skip trains, replacing it
    by the next sample and listing it in bad_files.txt; check-data lists it and exits 2."""
    members = {}
    for i in range(16):
        members[f"{i:04d}.png"] = b"\x89PNG garbage" if i == 3 else _png()
        members[f"{i:04d}.cls"] = str(i % 2).encode()
    shard = _tar(tmp_path / "s.tar", members)
    code, _, err = _pretrain(capsys, tmp_path, "data.name=wds", f"data.path={shard}", "train.batch_size=4")
    assert_one_line_error(code, err, f"cannot read image {shard}:0003.png", "data.on_bad_file=skip")

    code, text, err = _pretrain(capsys, tmp_path, "data.name=wds", f"data.path={shard}", "train.batch_size=4",
                                "data.on_bad_file=skip", "--overwrite")
    assert code == 0, err
    listed = (tmp_path / "run" / "bad_files.txt").read_text().splitlines()
    assert len(listed) == 1 and listed[0].startswith(f"{shard}:0003.png\t")

    code, text, err = run(capsys, "check-data", "--data", "wds", "--data-path", str(shard), "--no-progress")
    assert_one_line_error(code, err, "1 of 16 images", "are unreadable")
    assert "check-data: train: 16 images, 1 unreadable" in text and f"{shard}:0003.png" in text


@pytest.mark.slow
def test_shard_benchmark_smoke_run(capsys, monkeypatch):
    """benchmarks/shard_throughput.py on its smallest setting: one row per source, rates > 0 (not its timings). Run as
    ``__main__`` in this process: it times one process's work, and a fresh interpreter would only import torch again."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "shard_throughput.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--images", "8", "--batch", "4", "--rounds", "1", "--img-size", "32",
                                      "--shard-size", "3"])
    monkeypatch.syspath_prepend(str(script.parent))  # as `python benchmarks/x.py` puts its folder first
    before, threads = set(sys.modules), torch.get_num_threads()
    try:
        runpy.run_path(str(script), run_name="__main__")
        code = 0
    except SystemExit as e:  # what the script's process would have exited with
        code = e.code
    finally:
        for name in set(sys.modules) - before:  # its sibling modules (data_throughput, _measure): no other test sees them
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(script.parent)):
                del sys.modules[name]
        torch.set_num_threads(threads)  # the script sets a DataLoader worker's one thread
    stdout, stderr = capsys.readouterr()
    assert code == 0, stderr[-2000:]
    rows = {line[:20].strip(): line.split() for line in stdout.splitlines() if line.startswith(("folder", "wds", "hf"))}
    assert set(rows) == {"folder tree", "wds shards", "hf datasets folder"}
    assert all(float(r[-4]) > 0 for r in rows.values()), stdout
    assert "3 shard(s)" in stdout
