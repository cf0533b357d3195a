"""``resdecay import-weights`` and ``resdecay export``: the interop subcommands (interop/)."""

from __future__ import annotations

from ..interop import export_to_timm, import_weights


def cmd_import_weights(args) -> None:
    out = import_weights(args.src, args.format, args.preset, args.out, alpha_min=args.alpha_min, overrides=args.overrides)
    print(f"wrote {out} (resdecay checkpoint; try: resdecay eval {out})")


def cmd_export(args) -> None:
    out = export_to_timm(args.checkpoint, args.out, ema=args.ema)
    print(f"wrote {out} (load it with resdecay.interop.load_exported({str(out)!r}))")


def add_interop_commands(sub) -> None:
    iw = sub.add_parser("import-weights", help="convert an MAE / U-Net MAE / timm ViT checkpoint into a resdecay checkpoint")
    iw.add_argument("src", help="the foreign checkpoint (read with weights_only=True)")
    iw.add_argument("--format", required=True, help="mae (facebookresearch/mae) | unet-mae (the authors' U-Net MAE) | timm-vit")
    iw.add_argument("--alpha-min", type=float, default=None,
                    help="the source model's alpha_min, for a file that does not store it (a unet-mae file without its "
                         "training 'args'); the file's own value wins and a different one is refused")
    iw.add_argument("--preset", required=True, help="MAE preset for heads, data and training settings (dimensions come from the weights)")
    iw.add_argument("--out", required=True, help="the resdecay checkpoint to write (.pt)")
    iw.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. model.num_heads=6 data.path=/data/in100")
    iw.set_defaults(func=cmd_import_weights)

    ex = sub.add_parser("export", help="export a resdecay encoder as a decayified timm ViT (safetensors)")
    ex.add_argument("checkpoint", help="a resdecay MAE or classifier checkpoint")
    ex.add_argument("--to", required=True, choices=["timm"], help="target library (timm)")
    ex.add_argument("--out", required=True, help="the .safetensors file to write")
    ex.add_argument("--ema", action="store_true", help="export the EMA weights where the run kept them")
    ex.set_defaults(func=cmd_export)
