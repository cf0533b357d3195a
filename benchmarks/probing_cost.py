"""What the probing metrics cost (issue 50): the swept linear grid against one head and against its heads run one
after another, EP on cached tokens against EP re-running the frozen encoder every epoch, and the token store's
peak memory when the tokens exceed its budget.

What is measured (seeded random features and tokens, made before any timing; one run per row, wall-clock):

    linear   ``train_linear_heads`` with one head (the cls feature, lr 1e-3) | the default grid (4 features x 6 lrs x
             2 weight decays = 48 heads) in one pass | the same 48 heads trained one at a time (each exactly a
             lone probe); --epochs of batch 256 on --images x --dim features
    ep       ``train_heads`` (EP, Q 32, one base rate, the small recipe's AdamW) for --ep-epochs on cached tokens
             (--images x --tokens x --dim) | the same with a frozen ViT encoder (--depth blocks of width --dim, the
             tokens its output) run over the images each epoch before the EP step, as a probe without a cache would
    stream   a TokenStore of --stream-images x --tokens x --dim float16 tokens written to disk, then one shuffled pass
             over it with a --budget-mb budget: the growth of the process's peak resident set during the pass
             (VmHWM reset through /proc/self/clear_refs) against the budget and against the file's size
    imagenet ImageNet-1K's token count, 1,281,167 x 196 x 768 float16 (359 GiB: no RAM holds it), as a sparse .npy
             (the size is real, the contents zeros: nothing is written but the header), read by the TokenStore under
             the probes' default 2 GB budget: --imagenet-batches shuffled batches of 256, their peak resident growth
    end to end: the grid and one head each after the one feature pass every head shares (the frozen encoder over
             the images, ep's extract_s): what a user of the swept heads pays against one probe

    python benchmarks/probing_cost.py                                   # 10k x 64 tokens x 192 wide (issue 50's size)
    python benchmarks/probing_cost.py --images 200 --tokens 4 --dim 16 --epochs 1 --ep-epochs 1 --depth 1 \\
        --stream-images 300 --budget-mb 0.01 --imagenet-batches 2       # smoke run (tests/e2e/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from _measure import mem_peak, mem_start
from resdecay.eval.probing.heads import ep_probe
from resdecay.eval.probing.sweep import Head, train_linear_heads
from resdecay.eval.probing.tokens import TokenStore, TokenWriter
from resdecay.eval.probing.train import Split, train_heads
from resdecay.eval.protocol import IN100_RECIPE, SMALL_ATTENTIVE_RECIPE, SWEEP_LRS, SWEEP_WEIGHT_DECAYS


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def linear_rows(a, classes=10) -> dict:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, classes, (a.images,), generator=g)
    feats = {"cls": torch.randn(a.images, a.dim, generator=g), "patch_mean": torch.randn(a.images, a.dim, generator=g)}
    feats["cls+patch_mean"] = torch.cat([feats["cls"], feats["patch_mean"]], 1)
    feats["cls@last4"] = torch.randn(a.images, 4 * a.dim, generator=g)
    recipe = replace(IN100_RECIPE, epochs=a.epochs, batch_size=256)
    grid = [Head(f, lr, wd) for f in feats for lr in SWEEP_LRS for wd in SWEEP_WEIGHT_DECAYS]
    scored = {"test": {f: v[:100] for f, v in feats.items()}}
    one = timed(lambda: train_linear_heads(feats, y, scored, [Head("cls", 1e-3, 0.0)], classes, recipe))
    together = timed(lambda: train_linear_heads(feats, y, scored, grid, classes, recipe))
    apart = timed(lambda: [train_linear_heads(feats, y, scored, [h], classes, recipe) for h in grid])
    return {"heads": len(grid), "one_head_s": one, "grid_one_pass_s": together, "grid_one_by_one_s": apart,
            "grid_over_one": together / one, "grid_over_one_by_one": together / apart}


def ep_rows(a, classes=10) -> dict:
    from timm.models.vision_transformer import VisionTransformer

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, classes, (a.images,), generator=g)
    side = int(a.tokens ** 0.5)
    images = torch.randn(a.images, 3, side * 4, side * 4, generator=g)
    encoder = VisionTransformer(img_size=side * 4, patch_size=4, embed_dim=a.dim, depth=a.depth,
                                num_heads=max(1, a.dim // 64), num_classes=0, class_token=False, global_pool="").eval()
    recipe = replace(SMALL_ATTENTIVE_RECIPE, epochs=a.ep_epochs, warmup_epochs=0, blrs=(3e-3,))
    with tempfile.TemporaryDirectory() as tmp:
        writer = TokenWriter(Path(tmp) / "t.npy", a.images, "float16", {}, 2**40)
        start = time.perf_counter()
        with torch.no_grad():
            for i in range(0, a.images, 256):
                writer.add(encoder.forward_features(images[i:i + 256]))
        extract = time.perf_counter() - start
        store = writer.close()
        half = a.images // 2
        splits = [Split(store, idx, y[idx], prefix=0) for idx in (np.arange(half), np.arange(half, a.images))]
        cached = timed(lambda: train_heads(lambda: ep_probe(a.dim, classes, 32 if a.dim % 32 == 0 else 1), splits[0],
                                           splits[1], splits[1], recipe))
    # without a cache, every epoch runs the frozen encoder over the training images again
    rerun = extract * a.ep_epochs * half / a.images + cached
    return {"extract_s": extract, "ep_on_cached_tokens_s": cached, "ep_rerunning_encoder_s": rerun,
            "cached_total_s": extract + cached}


def stream_rows(a) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        budget = int(a.budget_mb * 2**20)
        writer = TokenWriter(Path(tmp) / "s.npy", a.stream_images, "float16", {}, budget)
        chunk = torch.randn(256, a.tokens, a.dim).half()
        for i in range(0, a.stream_images, 256):
            writer.add(chunk[: min(256, a.stream_images - i)])
        store = writer.close()
        method, base = mem_start(torch.device("cpu"))
        start = time.perf_counter()
        seen = sum(len(store.rows(b)) for b in store.batches(np.arange(len(store)), 256, torch.Generator().manual_seed(0)))
        seconds = time.perf_counter() - start
        peak = mem_peak(torch.device("cpu"), method, base)
        return {"file_mb": store.nbytes / 2**20, "budget_mb": a.budget_mb, "chunk_images": store.chunk,
                "access": store.access, "peak_growth_mb": peak, "pass_s": seconds, "images_read": seen}


IMAGENET = (1_281_167, 196, 768)  # ImageNet-1K's training images x ViT-B/16's 14 x 14 patches x its width


def imagenet_rows(a) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "imagenet.npy"
        np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=IMAGENET).flush()  # sparse: a header only
        store = TokenStore(path, int(a.imagenet_budget_mb * 2**20))
        batches = store.batches(np.arange(len(store)), 256, torch.Generator().manual_seed(0))
        method, base = mem_start(torch.device("cpu"))
        start = time.perf_counter()
        seen = sum(len(store.rows(next(batches))) for _ in range(a.imagenet_batches))
        seconds = time.perf_counter() - start
        peak = mem_peak(torch.device("cpu"), method, base)
        return {"shape": list(IMAGENET), "file_gib": store.nbytes / 2**30, "budget_mb": a.imagenet_budget_mb,
                "access": store.access, "images_read": seen, "read_s": seconds, "peak_growth_mb": peak}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=10_000)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--epochs", type=int, default=10, help="linear heads' epochs")
    p.add_argument("--ep-epochs", type=int, default=5)
    p.add_argument("--depth", type=int, default=12, help="the frozen encoder's blocks (EP without a cache)")
    p.add_argument("--stream-images", type=int, default=40_000)
    p.add_argument("--budget-mb", type=float, default=64.0)
    p.add_argument("--imagenet-batches", type=int, default=40, help="batches of 256 read from the ImageNet-size store")
    p.add_argument("--imagenet-budget-mb", type=float, default=2048.0, help="its budget (the probes' default)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    result = {"setting": vars(a), "threads": torch.get_num_threads(), "linear": linear_rows(a), "ep": ep_rows(a),
              "stream": stream_rows(a), "imagenet": imagenet_rows(a)}
    lin, ep, st, big = result["linear"], result["ep"], result["stream"], result["imagenet"]
    lin["end_to_end_grid_over_one"] = (ep["extract_s"] + lin["grid_one_pass_s"]) / (ep["extract_s"] + lin["one_head_s"])
    print(f"probing cost on {a.images} images x {a.tokens} tokens x {a.dim} wide, {result['threads']} threads")
    print(f"{'row':<44} {'seconds':>9}")
    print(f"{'linear: one head':<44} {lin['one_head_s']:>9.2f}")
    print(f"{'linear: ' + str(lin['heads']) + ' heads in one pass':<44} {lin['grid_one_pass_s']:>9.2f}  "
          f"({lin['grid_over_one']:.2f}x one head, {lin['grid_over_one_by_one']:.3f}x one by one)")
    print(f"{'linear: the same heads one after another':<44} {lin['grid_one_by_one_s']:>9.2f}")
    print(f"{'linear: end to end, after the one feature pass':<44} {'':>9}  ({lin['end_to_end_grid_over_one']:.3f}x one head)")
    print(f"{'EP: extract the tokens once':<44} {ep['extract_s']:>9.2f}")
    print(f"{'EP: ' + str(a.ep_epochs) + ' epochs on cached tokens':<44} {ep['ep_on_cached_tokens_s']:>9.2f}")
    print(f"{'EP: re-running the encoder every epoch':<44} {ep['ep_rerunning_encoder_s']:>9.2f}")
    print(f"stream: {st['file_mb']:.1f} MB of float16 tokens, budget {st['budget_mb']:g} MB ({st['access']}): "
          f"one shuffled pass {st['pass_s']:.2f} s, peak resident growth {st['peak_growth_mb']:.1f} MB")
    print(f"imagenet: {' x '.join(map(str, big['shape']))} float16 ({big['file_gib']:.0f} GiB, sparse), budget "
          f"{big['budget_mb']:g} MB ({big['access']}): {big['images_read']} images in {big['read_s']:.2f} s, peak "
          f"resident growth {big['peak_growth_mb']:.1f} MB")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
