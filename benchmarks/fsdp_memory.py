"""What each rank holds of a run's state under DDP and under FSDP2: weights, gradients, optimizer state and EMA per
preset, for a given number of ranks (default 8, one 8-GPU node).

What is measured
    The bytes of the state itself, read off the tensors a run would hold, not a formula: each preset's network is
    built on the meta device (no memory), and for FSDP2 sharded with resdecay's own ``train.parallel.parallelize``
    (each block, then the root) over an 8-rank mesh of torch's fake process group (one process stands for rank 0; no
    communication happens). The optimizer state is what the run's AdamW creates in one step (on meta tensors,
    sharded like their parameters), gradients take their parameters' local shapes (FSDP2 reduce-scatters them into
    shards), the EMA is a second copy of the weights sharded the same way (presets with ``train.ema_decay > 0``, as
    the trainer builds it). DDP is the same model unsharded: every rank holds all of it.

    "gathered" is FSDP2's transient on top of the state: the largest shard unit's weights all-gathered in the
    forward's dtype (bf16 on GPU), two at a time (the block computing and the one prefetched). Activations are not
    counted: they depend on the batch and are the same per sample in both layouts.

How to read the numbers
    MiB per rank; "state" = weights + grads + optimizer + EMA (+ buffers, which are never sharded: the alpha tables,
    fixed position embeddings). The ratio is DDP's state over FSDP2's.

    python benchmarks/fsdp_memory.py                                   # mae-b16, ViT-L and ViT-H MAEs, sit-xl2 on 8
    python benchmarks/fsdp_memory.py --ranks 64 --presets sit-xl2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys

from _measure import bad_input

# preset -> (label, overrides): the ViT-H/14 MAE is mae-l16 at the MAE paper's ViT-H sizes
PRESETS = {"mae-b16": ("MAE ViT-B/16", []), "mae-l16": ("MAE ViT-L/16", []),
           "mae-h14": ("MAE ViT-H/14", ["model.embed_dim=1280", "model.depth=32", "model.num_heads=16",
                                        "model.patch_size=14"]),
           "sit-xl2": ("SiT-XL/2", [])}
MIB = 2 ** 20


def local_bytes(tensors) -> int:
    """Bytes of this rank's part of each tensor (a DTensor's local shard, else the whole tensor)."""
    total = 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def state_of(cfg, mesh, param_dtype_bytes: int) -> dict:
    """The per-rank state of ``cfg``'s run, sharded over ``mesh`` (None: DDP, unsharded)."""
    import torch

    from resdecay.models import build_model
    from resdecay.train.optim import param_groups
    from resdecay.train.parallel import parallelize, shard_units

    with torch.device("meta"):
        model = build_model(cfg.model)
        ema = build_model(cfg.model) if cfg.train.ema_decay > 0 else None
    units = shard_units(model)
    largest = max(sum(p.numel() for p in u.parameters()) for u in units) if units else 0
    if mesh is not None:
        for m in (model, ema) if ema is not None else (model,):
            parallelize(m, mesh)
    trained = [p for p in model.parameters() if p.requires_grad]
    # the optimizer state the run's AdamW creates (foreach=False: the fused kernel refuses meta tensors)
    optimizer = torch.optim.AdamW(param_groups(model, cfg.train.weight_decay), lr=1e-4, foreach=False)
    for p in trained:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    row = {"params": sum(p.numel() for p in model.parameters()),
           "weights_mib": local_bytes(model.parameters()) / MIB, "grads_mib": local_bytes(trained) / MIB,
           "optimizer_mib": local_bytes(state) / MIB, "ema_mib": local_bytes(ema.parameters()) / MIB if ema else 0.0,
           "buffers_mib": local_bytes(model.buffers()) / MIB,
           "gathered_mib": 2 * largest * param_dtype_bytes / MIB if mesh is not None else 0.0}
    row["state_mib"] = sum(row[k] for k in ("weights_mib", "grads_mib", "optimizer_mib", "ema_mib", "buffers_mib"))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default=",".join(PRESETS),
                    help=f"comma list of presets ({', '.join(PRESETS)} or any shipped preset)")
    ap.add_argument("--ranks", type=int, default=8, help="processes the state is sharded over (default 8)")
    ap.add_argument("--param-bytes", type=int, default=2, choices=[2, 4],
                    help="bytes per gathered weight in the forward: 2 (bf16 on GPU, default) or 4 (fp32)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    if args.ranks < 1:
        bad_input(f"--ranks must be >= 1, got {args.ranks}")
    from resdecay.errors import ConfigError
    from resdecay.train.config import load_config

    configs = {}
    for name in [n.strip() for n in args.presets.split(",") if n.strip()]:
        label, overrides = PRESETS.get(name, (name, []))
        try:
            configs[name] = (label, load_config("mae-l16" if name == "mae-h14" else name, overrides))
        except (ConfigError, ValueError, OSError) as e:
            bad_input(f"--presets {name}: {str(e).splitlines()[0]}")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=args.ranks)
    mesh = init_device_mesh("cpu", (args.ranks,))
    print(f"fsdp_memory | torch {torch.__version__} | {args.ranks} ranks (fake process group, meta tensors) | AdamW | "
          f"gathered weights {'bf16' if args.param_bytes == 2 else 'fp32'}, 2 units")
    head = (f"{'preset':<10} {'model':<14} {'params':>8} {'layout':<6} {'weights':>8} {'grads':>8} {'AdamW':>8} "
            f"{'EMA':>8} {'state':>9} {'gathered':>9} {'DDP/FSDP2':>10}")
    print(head + "\n" + "-" * len(head))
    rows = []
    for name, (label, cfg) in configs.items():
        ddp, fsdp = state_of(cfg, None, args.param_bytes), state_of(cfg, mesh, args.param_bytes)
        for layout, r in (("ddp", ddp), ("fsdp2", fsdp)):
            r.update(preset=name, model=label, layout=layout, ranks=args.ranks,
                     ratio=ddp["state_mib"] / fsdp["state_mib"] if layout == "fsdp2" else None)
            rows.append(r)
            ratio = f"{r['ratio']:.2f}x" if r["ratio"] else ""
            print(f"{name:<10} {label:<14} {r['params'] / 1e6:>7.1f}M {layout:<6} {r['weights_mib']:>8.1f} "
                  f"{r['grads_mib']:>8.1f} {r['optimizer_mib']:>8.1f} {r['ema_mib']:>8.1f} {r['state_mib']:>9.1f} "
                  f"{r['gathered_mib']:>9.1f} {ratio:>10}", flush=True)
    dist.destroy_process_group()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "fsdp_memory", "torch": torch.__version__, "ranks": args.ranks,
                       "param_bytes": args.param_bytes, "unit": "MiB per rank", "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
