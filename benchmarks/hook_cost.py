"""What ``decayify``'s hooks cost: a decayified library model against the same model undecayified.

What is measured
    Two library models with random weights (seed 0): timm's ViT-S/16 (``vit_small_patch16_224``) and transformers'
    ``ViTModel`` at the same size (hidden 384, 12 layers, 6 heads, MLP 1536, 224 px, patch 16). Each is copied; the
    copy is ``decayify(model, alpha_min=0.5)``'d (every add but the first gets a pre-hook keeping x and a hook
    returning ``out - (1 - alpha) * x`` on the module the block adds), the original is the reference: the same
    weights, the library's own forward. One iteration is a forward and a backward of ``out.float().mean()`` on a
    batch of random images (``--forward-only``: the forward under ``torch.no_grad``). Rows: eager, and both models
    through ``torch.compile`` (its compilation in the warm-up, not timed).

How
    Reference and decayified are timed in alternation (AB, BA, ...) for ``--repeats`` rounds of ``--iters``
    iterations each, so that drift hits both alike; per round the ratio decayified / reference. ratio: the median
    of those; +-: half their inter-quartile range (the noise). Targets: eager <= 1.02, compiled <= 1.01.

    python benchmarks/hook_cost.py                              # ViT-S/16 at 224, batch 8, CPU, 2 threads
    python benchmarks/hook_cost.py --device cuda --batch 64     # a GPU
    python benchmarks/hook_cost.py --img-size 32 --patch 8 --depth 2 --batch 2 --repeats 2 --iters 1 \\
        --warmup 1 --compile-backend eager                      # smoke run (seconds; tests/e2e)
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time

from _measure import bad_input

MODELS = ("timm", "transformers")
TARGET = {"eager": 1.02, "compiled": 1.01}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma list of timm, transformers")
    p.add_argument("--modes", default="eager,compiled", help="comma list of eager, compiled")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per model (compilation happens here)")
    p.add_argument("--iters", type=int, default=2, help="iterations per timed window")
    p.add_argument("--repeats", type=int, default=10, help="AB rounds")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--forward-only", action="store_true", help="time the forward under no_grad (inference)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (the smoke run: eager)")
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args(argv)
    a.models, a.modes = a.models.split(","), a.modes.split(",")
    for value, known, flag in [(m, MODELS, "--models") for m in a.models] + [(m, TARGET, "--modes") for m in a.modes]:
        if value not in known:
            bad_input(f"{flag} {value!r} is unknown; choose from {', '.join(known)}")
    for name in ("img_size", "patch", "depth", "batch", "warmup", "iters", "threads"):
        if getattr(a, name) < 1:
            bad_input(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(a, name)}")
    if a.repeats < 2:
        bad_input(f"--repeats must be at least 2 (the noise is their spread), got {a.repeats}")
    if a.img_size % a.patch:
        bad_input(f"--img-size {a.img_size} is not a multiple of --patch {a.patch}")
    return a


def build(kind: str, a):
    """(model, call) at ViT-S width with ``a``'s size; ``call(model, x)`` returns the last hidden states."""
    import torch
    torch.manual_seed(0)
    if kind == "timm":
        import timm
        model = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=a.img_size, patch_size=a.patch,
                                  depth=a.depth, num_classes=0)
        return model, lambda m, x: m.forward_features(x)
    from transformers import ViTConfig, ViTModel
    config = ViTConfig(hidden_size=384, num_hidden_layers=a.depth, num_attention_heads=6, intermediate_size=1536,
                       image_size=a.img_size, patch_size=a.patch)
    return ViTModel(config, add_pooling_layer=False), lambda m, x: m(pixel_values=x).last_hidden_state


def step_ms(model, call, x, iters: int, forward_only: bool) -> float:
    """Mean milliseconds of one iteration over ``iters`` back to back."""
    import torch
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        if forward_only:
            with torch.no_grad():
                call(model, x)
        else:
            call(model, x).float().mean().backward()
            model.zero_grad(set_to_none=True)
    sync()
    return (time.perf_counter() - t0) * 1e3 / iters


def measure(kind: str, mode: str, a) -> dict:
    import torch

    from resdecay import alphas_of, decayify
    model, call = build(kind, a)
    model = model.to(a.device).train(not a.forward_only)
    decayed = decayify(copy.deepcopy(model), alpha_min=0.5)  # same weights; only the hooks differ
    x = torch.randn(a.batch, 3, a.img_size, a.img_size, generator=torch.Generator().manual_seed(1)).to(a.device)
    with torch.no_grad():  # the hooks act: the decayified model is not the reference
        assert not torch.allclose(call(model.eval(), x), call(decayed.eval(), x))
    model.train(not a.forward_only), decayed.train(not a.forward_only)
    if mode == "compiled":
        model, decayed = torch.compile(model, backend=a.compile_backend), torch.compile(decayed, backend=a.compile_backend)
    pair = {"reference": model, "decayified": decayed}
    for m in pair.values():
        step_ms(m, call, x, a.warmup, a.forward_only)
    times = {k: [] for k in pair}
    ratios = []
    for r in range(a.repeats):
        for k in (("reference", "decayified") if r % 2 == 0 else ("decayified", "reference")):
            times[k].append(step_ms(pair[k], call, x, a.iters, a.forward_only))
        ratios.append(times["decayified"][-1] / times["reference"][-1])
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    ratio = statistics.median(ratios)
    return {"model": kind, "mode": mode, "reference_ms": statistics.median(times["reference"]),
            "decayified_ms": statistics.median(times["decayified"]), "ratio": ratio, "noise": (q3 - q1) / 2,
            "target": TARGET[mode], "within": ratio <= TARGET[mode], "hooked_adds": sum(
                a_ != 1.0 for _, alphas in alphas_of(decayed if mode == "eager" else decayed._orig_mod) for a_ in alphas)}


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        bad_input("--device cuda: no CUDA device visible")
    torch.set_num_threads(a.threads)
    name = torch.cuda.get_device_name() if a.device == "cuda" else (platform.processor() or platform.machine())
    what = "forward (no_grad)" if a.forward_only else "forward+backward"
    print(f"hook_cost | torch {torch.__version__} | {a.device} ({name}) | threads {torch.get_num_threads()} | {what} | "
          f"ViT-S width, depth {a.depth}, {a.img_size} px / patch {a.patch}, batch {a.batch} | "
          f"{a.repeats} AB rounds x {a.iters} iters, {a.warmup} warm-up | compile backend {a.compile_backend}")
    head = (f"{'model':<13} {'mode':<9} {'hooked adds':>11} {'reference ms':>13} {'decayified ms':>14} {'ratio':>7} "
            f"{'+-':>6}  verdict")
    print(head + "\n" + "-" * len(head))
    rows = []
    for kind in a.models:
        for mode in a.modes:
            row = measure(kind, mode, a)
            rows.append(row)
            verdict = "within" if row["within"] else ("within noise" if row["ratio"] - row["noise"] <= row["target"]
                                                      else "OVER")
            print(f"{kind:<13} {mode:<9} {row['hooked_adds']:>11} {row['reference_ms']:>13.1f} "
                  f"{row['decayified_ms']:>14.1f} {row['ratio']:>7.3f} {row['noise']:>6.3f}  {verdict} "
                  f"(target <= {row['target']})", flush=True)
    if a.json:
        meta = {"benchmark": "hook_cost", "torch": torch.__version__, "device": a.device, "device_name": name,
                "threads": torch.get_num_threads(), "forward_only": a.forward_only, "img_size": a.img_size,
                "patch": a.patch, "depth": a.depth, "batch": a.batch, "repeats": a.repeats, "iters": a.iters,
                "compile_backend": a.compile_backend}
        with open(a.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
