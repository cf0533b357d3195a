"""What ``decayify``'s mechanisms cost: a decayified library model against the same model undecayified.

What is measured
    Two library models with random weights (seed 0): timm's ViT-S/16 (``vit_small_patch16_224``) and transformers'
    ``ViTModel`` at the same size (hidden 384, 12 layers, 6 heads, MLP 1536, 224 px, patch 16). Each is copied once per
    mechanism and ``decayify(model, alpha_min=0.5)``'d (every add but the first decayed); the original is the
    reference: the same weights, the library's own forward. Mechanisms (``--mechanisms``):

    hooks   the correction hooks (``resdecay.nn.adapters.hooks``): a pre-hook keeping x and a hook returning
            ``out - (1 - alpha) * x`` on the module the block adds, so the library's ``x + out`` is alpha x + out;
    fused   what ``decayify`` installs by default where the block's forward traces (``adapters/fused.py``): the
            forward generated from the traced graph, each residual add one ``torch.add(f, x, alpha=alpha)``.

    One iteration is a forward and a backward of ``out.float().mean()`` on a batch of random images
    (``--forward-only``: the forward under ``torch.no_grad``). Rows: eager, and every model through ``torch.compile``
    (its compilation in the warm-up, not timed).

How
    The reference and the decayified models are timed in turn, the order rotated every round (for two mechanisms:
    the six orders of three, in turn), for ``--repeats`` rounds of ``--iters`` iterations each, so that drift hits
    all alike; per round the ratio decayified / reference. ratio: the median of those; +-: half their inter-quartile
    range (the noise). Targets: eager <= 1.02, compiled <= 1.01. ``--clock cpu`` times the process's CPU time
    (``time.process_time``, with ``--threads 1``) instead of the wall clock: on a CPU shared with other jobs, the time
    this process was not running is then not counted (what is left is cache and memory-bandwidth contention).

    python benchmarks/hook_cost.py                              # ViT-S/16 at 224, batch 8, CPU, 2 threads
    python benchmarks/hook_cost.py --device cuda --batch 64     # a GPU
    python benchmarks/hook_cost.py --threads 1 --clock cpu      # a shared CPU
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
MECHANISMS = ("hooks", "fused")
TARGET = {"eager": 1.02, "compiled": 1.01}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma list of timm, transformers")
    p.add_argument("--modes", default="eager,compiled", help="comma list of eager, compiled")
    p.add_argument("--mechanisms", default=",".join(MECHANISMS), help="comma list of hooks, fused")
    p.add_argument("--img-size", type=int, default=224)
    p.add_argument("--patch", type=int, default=16)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations per model (compilation happens here)")
    p.add_argument("--iters", type=int, default=2, help="iterations per timed window")
    p.add_argument("--repeats", type=int, default=10, help="rounds (each times every model once, in rotated order)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                   help="wall: time.perf_counter; cpu: this process's CPU time (needs --threads 1, a CPU run)")
    p.add_argument("--forward-only", action="store_true", help="time the forward under no_grad (inference)")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (the smoke run: eager)")
    p.add_argument("--json", default=None, help="also write the rows here")
    a = p.parse_args(argv)
    a.models, a.modes, a.mechanisms = a.models.split(","), a.modes.split(","), a.mechanisms.split(",")
    for value, known, flag in ([(m, MODELS, "--models") for m in a.models] + [(m, TARGET, "--modes") for m in a.modes]
                               + [(m, MECHANISMS, "--mechanisms") for m in a.mechanisms]):
        if value not in known:
            bad_input(f"{flag} {value!r} is unknown; choose from {', '.join(known)}")
    for name in ("img_size", "patch", "depth", "batch", "warmup", "iters", "threads"):
        if getattr(a, name) < 1:
            bad_input(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(a, name)}")
    if a.repeats < 2:
        bad_input(f"--repeats must be at least 2 (the noise is their spread), got {a.repeats}")
    if a.clock == "cpu" and (a.threads != 1 or a.device != "cpu"):
        bad_input("--clock cpu times one thread's work on the CPU: give --threads 1 and --device cpu")
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


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def step_ms(model, call, x, iters: int, forward_only: bool, clock: str = "wall") -> float:
    """Mean milliseconds of one iteration over ``iters`` back to back, on ``clock`` (``CLOCKS``)."""
    import torch
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    now = CLOCKS[clock]
    sync()
    t0 = now()
    for _ in range(iters):
        if forward_only:
            with torch.no_grad():
                call(model, x)
        else:
            call(model, x).float().mean().backward()
            model.zero_grad(set_to_none=True)
    sync()
    return (now() - t0) * 1e3 / iters


def decayified(model, mechanism: str):
    """A decayified copy of ``model`` reached by ``mechanism`` (checked: every decayed block by it)."""
    import contextlib

    from resdecay import alphas_of, decayify
    from resdecay.nn.adapters.fused import hooks_only, is_fused
    with hooks_only() if mechanism == "hooks" else contextlib.nullcontext():
        out = decayify(copy.deepcopy(model), alpha_min=0.5)  # same weights; only the mechanism differs
    blocks = [out.get_submodule(name) for name, alphas in alphas_of(out) if any(v != 1.0 for v in alphas)]
    assert blocks and all(is_fused(b) == (mechanism == "fused") for b in blocks), mechanism
    return out


def orders(names: list[str], repeats: int) -> list[tuple]:
    """The timing order of each round: every rotation of ``names`` and of its reverse, in turn."""
    turns = [tuple(names[i:] + names[:i]) for i in range(len(names))]
    turns += [tuple(reversed(t)) for t in turns]
    return [turns[r % len(turns)] for r in range(repeats)]


def measure(kind: str, mode: str, a) -> list[dict]:
    """One row per mechanism: its model against the reference, timed in the same rounds."""
    import torch

    from resdecay import alphas_of
    model, call = build(kind, a)
    model = model.to(a.device).train(not a.forward_only)
    models = {"reference": model, **{m: decayified(model, m) for m in a.mechanisms}}
    x = torch.randn(a.batch, 3, a.img_size, a.img_size, generator=torch.Generator().manual_seed(1)).to(a.device)
    with torch.no_grad():  # the mechanisms act (not the reference), and agree with each other
        outs = {k: call(m.eval(), x) for k, m in models.items()}
    assert all(not torch.allclose(outs["reference"], outs[m]) for m in a.mechanisms)
    assert all(torch.allclose(outs[a.mechanisms[0]], outs[m], rtol=1e-4, atol=1e-5) for m in a.mechanisms)
    decayed = sum(v != 1.0 for _, alphas in alphas_of(models[a.mechanisms[0]]) for v in alphas)
    for m in models.values():
        m.train(not a.forward_only)
    if mode == "compiled":
        models = {k: torch.compile(m, backend=a.compile_backend) for k, m in models.items()}
    for m in models.values():
        step_ms(m, call, x, a.warmup, a.forward_only)
    times = {k: [] for k in models}
    for order in orders(list(models), a.repeats):
        for k in order:
            times[k].append(step_ms(models[k], call, x, a.iters, a.forward_only, a.clock))
    rows = []
    for mech in a.mechanisms:
        ratios = [t / r for t, r in zip(times[mech], times["reference"], strict=True)]
        q1, _, q3 = statistics.quantiles(ratios, n=4)
        ratio = statistics.median(ratios)
        rows.append({"model": kind, "mode": mode, "mechanism": mech, "reference_ms": statistics.median(times["reference"]),
                     "decayified_ms": statistics.median(times[mech]), "ratio": ratio, "noise": (q3 - q1) / 2,
                     "target": TARGET[mode], "within": ratio <= TARGET[mode], "decayed_adds": decayed})
    return rows


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
          f"{a.repeats} rounds x {a.iters} iters, {a.warmup} warm-up | compile backend {a.compile_backend} | "
          f"{a.clock} clock")
    head = (f"{'model':<13} {'mode':<9} {'mechanism':<9} {'decayed adds':>12} {'reference ms':>13} "
            f"{'decayified ms':>14} {'ratio':>7} {'+-':>6}  verdict")
    print(head + "\n" + "-" * len(head))
    rows = []
    for kind in a.models:
        for mode in a.modes:
            for row in measure(kind, mode, a):
                rows.append(row)
                verdict = "within" if row["within"] else ("within noise" if row["ratio"] - row["noise"] <= row["target"]
                                                          else "OVER")
                print(f"{kind:<13} {mode:<9} {row['mechanism']:<9} {row['decayed_adds']:>12} {row['reference_ms']:>13.1f} "
                      f"{row['decayified_ms']:>14.1f} {row['ratio']:>7.3f} {row['noise']:>6.3f}  {verdict} "
                      f"(target <= {row['target']})", flush=True)
    if a.json:
        meta = {"benchmark": "hook_cost", "torch": torch.__version__, "device": a.device, "device_name": name,
                "threads": torch.get_num_threads(), "forward_only": a.forward_only, "img_size": a.img_size,
                "patch": a.patch, "depth": a.depth, "batch": a.batch, "repeats": a.repeats, "iters": a.iters,
                "compile_backend": a.compile_backend, "mechanisms": a.mechanisms, "clock": a.clock}
        with open(a.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=1)
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
