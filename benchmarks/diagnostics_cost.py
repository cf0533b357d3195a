"""What the residual-stream diagnostics cost (``resdecay.diagnose``), beside the forward passes a kNN / probe
evaluation of the same images already pays.

What is measured
    A timm ViT (default ViT-S/16 at 224, random weights, seed 0) on random images (seeded, made before any timing),
    ``--images`` test images and as many train images. Rows, each one wall-clock run after one warm-up batch:

    forward      the reference: ``forward_features`` over the test and the train images, batches of ``--batch``
                 (what extracting kNN / probe features of the same images costs);
    paths        the path decomposition and the branch norms (``which=("paths", "branches")``), test images;
    pixels       the pixel / high-frequency ridge of every layer (test and train images, ``--pixel-patches`` per image);
    knockout     each block's branches removed in turn (``--knockout-images`` of each split, with the kNN);
    all          ``diagnose`` with every diagnostic, as ``resdecay eval --evals diagnostics`` runs it.

    The ratio column is seconds / the forward row's. One run per row, ``--threads`` torch threads.

    python benchmarks/diagnostics_cost.py                           # ViT-S/16, 1,000 images, 2 threads
    python benchmarks/diagnostics_cost.py --rows all                # the forward reference and eval's diagnostics only
    python benchmarks/diagnostics_cost.py --model vit_tiny_patch16_224 --img-size 32 --patch 8 --depth 2 --images 16 \\
        --knockout-images 8                                          # smoke run (seconds; tests/e2e)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

ROWS = ("forward", "paths", "pixels", "knockout", "all")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="vit_small_patch16_224", help="a timm ViT name (random weights)")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--depth", type=int, default=None, help="blocks (default: the model's)")
    p.add_argument("--images", type=int, default=1000, help="test images, and as many train images")
    p.add_argument("--knockout-images", type=int, default=256)
    p.add_argument("--pixel-patches", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma list of rows to time (default all: {','.join(ROWS)}; "
                                                          "forward always runs, it is the reference)")
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args(argv)
    for name in ("img_size", "patch", "images", "knockout_images", "pixel_patches", "batch", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(a, name)}")
    a.rows = ["forward", *[r for r in a.rows.split(",") if r and r != "forward"]]
    bad = [r for r in a.rows if r not in ROWS]
    if bad:
        p.error(f"--rows {bad[0]!r} is unknown; choose from {', '.join(ROWS)}")
    if a.img_size % a.patch:
        p.error(f"--img-size {a.img_size} is not a multiple of --patch {a.patch}")
    return a


def main(argv=None) -> dict:
    a = parse(argv)
    import timm  # after the arguments: a bad one is answered without loading torch
    import torch

    from resdecay import diagnose

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    extra = {} if a.depth is None else {"depth": a.depth}
    model = timm.create_model(a.model, pretrained=False, img_size=a.img_size, patch_size=a.patch, **extra).eval()
    g = torch.Generator().manual_seed(1)
    test = torch.randn(a.images, 3, a.img_size, a.img_size, generator=g)
    train = torch.randn(a.images, 3, a.img_size, a.img_size, generator=g)
    labels = torch.arange(a.images) % 10
    common = dict(train_images=train, labels=labels, train_labels=labels, batch_size=a.batch,
                  pixel_patches=a.pixel_patches, knockout_images=a.knockout_images)

    def forward():
        with torch.no_grad():
            for x in (test, train):
                for i in range(0, len(x), a.batch):
                    model.forward_features(x[i:i + a.batch])

    rows = {"forward": forward,
            "paths": lambda: diagnose(model, test, which=("paths", "branches"), **common),
            "pixels": lambda: diagnose(model, test, which=("pixels",), **common),
            "knockout": lambda: diagnose(model, test, which=("knockout",), **common),
            "all": lambda: diagnose(model, test, **common)}
    with torch.no_grad():
        model.forward_features(test[:a.batch])  # warm-up
    seconds = {}
    for name, fn in ((n, rows[n]) for n in a.rows):
        t0 = time.perf_counter()
        fn()
        seconds[name] = time.perf_counter() - t0
    base = seconds["forward"]
    print(f"diagnostics cost | timm {a.model} {a.img_size}px patch {a.patch}, {len(model.blocks)} blocks | {a.images} test + "
          f"{a.images} train images, knock-out on {a.knockout_images}, {a.pixel_patches} patches/image | {a.threads} threads, "
          f"{platform.processor() or platform.machine()}")
    print(f"{'row':<10} {'seconds':>9} {'x forward':>10}")
    for name, s in seconds.items():
        print(f"{name:<10} {s:>9.2f} {s / base:>10.2f}")
    result = {"args": vars(a), "seconds": seconds, "torch": torch.__version__}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
