"""``resdecay import-weights`` and ``resdecay export``: the interop subcommands (interop/)."""

from __future__ import annotations

import warnings

from ..errors import UserError, one_line
from ..interop import export_to_hf, export_to_timm, import_weights
from ..interop.hf_vitmae import DecayDroppedWarning, LayerNormEpsWarning, export_to_vitmae
from ..interop.import_weights import AlphaUnknownWarning

OURS = (AlphaUnknownWarning, LayerNormEpsWarning, DecayDroppedWarning)  # printed as one line each


def _print_warnings(caught) -> None:
    for w in caught:  # ours in one line (a Python warning prints its source line under it); others as Python shows them
        if issubclass(w.category, OURS):
            print(f"warning: {one_line(w.message)}")
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def cmd_import_weights(args) -> None:
    with warnings.catch_warnings(record=True) as caught:
        for category in OURS:
            warnings.simplefilter("always", category)
        out = import_weights(args.src, args.format, args.preset, args.out, alpha_min=args.alpha_min, overrides=args.overrides)
    _print_warnings(caught)
    print(f"wrote {out} (resdecay checkpoint; try: resdecay eval {out})")


def cmd_export(args) -> None:
    if args.to == "hf":
        out = export_to_hf(args.checkpoint, args.out, ema=args.ema, eval_json=args.eval_json, license=args.license)
        print(f"wrote {out}/ (config.json, model.safetensors, README.md; load it with resdecay.from_pretrained({str(out)!r}), "
              f"share it with resdecay.push_to_hub({str(out)!r}, 'user/name'))")
        return
    for flag, value in (("--eval-json", args.eval_json), ("--license", args.license)):
        if value is not None:
            raise UserError(f"{flag} applies to --to hf (a model card); a {args.to} export has none")
    if args.to == "hf-vitmae":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DecayDroppedWarning)
            out = export_to_vitmae(args.checkpoint, args.out, ema=args.ema)
        _print_warnings(caught)
        print(f"wrote {out}/ (config.json, model.safetensors; load it with "
              f"transformers.ViTMAEForPreTraining.from_pretrained({str(out)!r}))")
        return
    out = export_to_timm(args.checkpoint, args.out, ema=args.ema)
    print(f"wrote {out} (load it with resdecay.interop.load_exported({str(out)!r}))")


def add_interop_commands(sub) -> None:
    iw = sub.add_parser("import-weights", help="convert an MAE / U-Net MAE / timm ViT / Hugging Face ViTMAE checkpoint into a "
                                               "resdecay checkpoint")
    iw.add_argument("src", help="the foreign checkpoint (read with weights_only=True); hf-vitmae: the transformers folder")
    iw.add_argument("--format", required=True, help="mae (facebookresearch/mae) | unet-mae (the authors' U-Net MAE) | timm-vit | "
                                                    "hf-vitmae (transformers ViTMAEForPreTraining folder)")
    iw.add_argument("--alpha-min", type=float, default=None,
                    help="the source model's alpha_min, for a file that does not store it (a unet-mae file without its "
                         "training 'args'); the file's own value wins and a different one is refused")
    iw.add_argument("--preset", required=True, help="MAE preset for heads, data and training settings (dimensions come from the weights)")
    iw.add_argument("--out", required=True, help="the resdecay checkpoint to write (.pt)")
    iw.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. model.num_heads=6 data.path=/data/in100")
    iw.set_defaults(func=cmd_import_weights)

    ex = sub.add_parser("export", help="export a model: a decayified timm ViT (safetensors) or a huggingface_hub-style "
                                       "folder with a model card (hf)")
    ex.add_argument("checkpoint", help="a resdecay checkpoint (--to hf: any family; --to timm: an MAE or classifier, or a "
                                      "save_pretrained folder of one)")
    ex.add_argument("--to", required=True, choices=["timm", "hf", "hf-vitmae"],
                    help="timm: one .safetensors file a timm ViT loads (alpha in its metadata); hf: a save_pretrained "
                         "folder (config.json, model.safetensors, README.md model card) for resdecay.from_pretrained; "
                         "hf-vitmae: a folder transformers.ViTMAEForPreTraining.from_pretrained loads (plain MAE; a "
                         "decayed one with a warning, its decay kept under \"resdecay\" in config.json)")
    ex.add_argument("--out", required=True, help="--to timm: the .safetensors file to write; --to hf / hf-vitmae: the folder")
    ex.add_argument("--ema", action="store_true", help="export the EMA weights where the run kept them")
    ex.add_argument("--eval-json", default=None,
                    help="--to hf: the eval.json whose numbers the card reports (default: <run>/eval/eval.json when there is one)")
    ex.add_argument("--license", default=None, help="--to hf: a license identifier for the card's metadata (mit, apache-2.0, ...)")
    ex.set_defaults(func=cmd_export)
