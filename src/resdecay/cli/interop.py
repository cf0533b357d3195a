"""``resdecay import-weights`` and ``resdecay export``: the parsers of the interop subcommands
(``commands/interop.py`` runs them)."""

from __future__ import annotations

from ..commands.interop import run_export, run_import_weights
from ..train.import_formats import IMPORT_FORMATS


def add_interop_commands(sub) -> None:
    iw = sub.add_parser("import-weights", help="convert an MAE / U-Net MAE / timm ViT / Hugging Face ViTMAE checkpoint into a "
                                               "resdecay checkpoint")
    iw.add_argument("src", help="the foreign checkpoint (read with weights_only=True); hf-vitmae: the transformers folder")
    formats = " | ".join(f"{f.name} ({f.description})" for f in IMPORT_FORMATS.values() if not f.native)
    iw.add_argument("--format", required=True, help=f"{formats} (the registered import formats)".replace("%", "%%"))
    iw.add_argument("--alpha-min", type=float, default=None,
                    help="the source model's alpha_min, for a file that does not store it (a unet-mae file without its "
                         "training 'args'); the file's own value wins and a different one is refused")
    iw.add_argument("--preset", required=True, help="MAE preset for heads, data and training settings (dimensions come from the weights)")
    iw.add_argument("--out", required=True, help="the resdecay checkpoint to write (.pt)")
    iw.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. model.num_heads=6 data.path=/data/in100")
    iw.set_defaults(func=lambda a: run_import_weights(a.src, a.format, a.preset, a.out, alpha_min=a.alpha_min,
                                                      overrides=a.overrides))

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
    ex.set_defaults(func=lambda a: run_export(a.checkpoint, a.to, a.out, ema=a.ema, eval_json=a.eval_json, license=a.license))
