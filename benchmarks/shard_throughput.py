"""Sharded inputs: images/s per core read from tar shards (``data.name=wds``) and from a
``datasets`` folder (``data.name=hf``) next to the same JPEGs read from the folder tree, in one
process, interleaved.

What is measured
    What one DataLoader worker does per batch (``data_throughput.one_pass``): read the bytes, decode
    (TorchCodec, else PIL), MAE's training view (RandomResizedCrop 0.2-1 to 224 + flip, seeded per
    sample), normalise in the worker (float32 batches: the shard datasets hand floats to the loader)
    and collate. One thread, so img/s here = img/s per core. The folder row is ``data.decoder=tensor``
    with float output, the same work but for where the bytes come from.

The data
    ``data_throughput.make_jpegs``' photograph-like JPEGs (~500x375, q90) in a temporary ImageFolder,
    written as shards by ``resdecay shard`` (``--shard-size``) and as a ``save_to_disk`` folder of the
    same bytes (an ``Image`` column). The one-time cost of reading the shards' member lists (the
    index) is printed apart.

    python benchmarks/shard_throughput.py
    python benchmarks/shard_throughput.py --images 384 --rounds 7 --shard-size 64
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from _measure import bad_input
from data_throughput import make_jpegs, one_pass
from resdecay.commands.shard import run_shard
from resdecay.data import DataConfig, SeededSamples, build_dataset


def save_as_hf(folder: Path, out: Path) -> bool:
    """The folder's train/ files (bytes unchanged) as a datasets folder; False without ``datasets``."""
    try:
        import datasets
    except ImportError:
        return False
    ds, _ = build_dataset(DataConfig("imagefolder", path=str(folder)), "train", 8)
    rows = {"image": [{"bytes": Path(p).read_bytes(), "path": None} for p, _ in ds.samples],
            "label": [label for _, label in ds.samples]}
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=len(ds.classes))})
    datasets.disable_progress_bars()
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(out))
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--shard-size", type=int, default=64)
    args = ap.parse_args()
    for k in ("images", "batch", "rounds", "img_size", "shard_size"):
        if getattr(args, k) < 1:
            bad_input(f"--{k.replace('_', '-')} must be a positive integer, got {getattr(args, k)}")
    if args.images < args.batch:
        bad_input(f"--images {args.images} is fewer than one batch (--batch {args.batch})")
    torch.set_num_threads(1)  # a DataLoader worker's setting

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_jpegs(root / "folder", args.images)
        run_shard(str(root / "folder"), str(root / "shards"), args.shard_size, progress=False)
        sources = {"folder tree": DataConfig("imagefolder", path=str(root / "folder"), augment="mae"),
                   "wds shards": DataConfig("wds", path=str(root / "shards"), augment="mae")}
        if save_as_hf(root / "folder", root / "hf"):
            sources["hf datasets folder"] = DataConfig("hf", path=str(root / "hf"), augment="mae")
        paths, index_s = {}, {}
        for name, cfg in sources.items():
            t0 = time.perf_counter()
            ds, _ = build_dataset(cfg, "train", args.img_size)
            index_s[name] = time.perf_counter() - t0
            paths[name] = SeededSamples(ds, seed=0)
        used = args.images // args.batch * args.batch
        for s in paths.values():  # warm-up
            one_pass(s, 0, args.batch)
        rates = {k: [] for k in paths}
        names = list(paths)
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[: r % len(names)]:  # rotate the order
                rates[k].append(used / one_pass(paths[k], r + 1, args.batch))

    base = statistics.median(rates["folder tree"])
    load = os.getloadavg()
    print(f"# sharded inputs, one core, {args.images} JPEGs (~500x375, q90), batch {args.batch}, {args.img_size}px MAE "
          f"crops, float batches, {args.rounds} interleaved rounds, {args.shard_size} images a shard")
    print(f"# host: {platform.node()} | {os.cpu_count()} CPUs | torch {torch.__version__} | "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"{'source':<20}{'img/s/core':>12}{'min..max':>16}{'vs folder':>11}{'build (index) s':>17}")
    for k in names:
        med = statistics.median(rates[k])
        print(f"{k:<20}{med:>12.1f}{f'{min(rates[k]):.0f}..{max(rates[k]):.0f}':>16}{med / base:>10.2f}x"
              f"{index_s[k]:>17.3f}")
    if "hf datasets folder" not in names:
        print(f"{'hf datasets folder':<20}  not measured: datasets not installed (pip install 'resdecay[shards]')")


if __name__ == "__main__":
    main()
