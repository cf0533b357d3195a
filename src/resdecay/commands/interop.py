"""``resdecay import-weights`` and ``resdecay export``: the commands around ``resdecay.interop``, with
interop's own warnings printed as one line each."""

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


def run_import_weights(src: str, fmt: str, preset: str, out: str, alpha_min: float | None = None,
                       overrides: list[str] | None = None) -> None:
    """A foreign checkpoint at ``src`` (format ``fmt``) written as a resdecay checkpoint at ``out``."""
    with warnings.catch_warnings(record=True) as caught:
        for category in OURS:
            warnings.simplefilter("always", category)
        path = import_weights(src, fmt, preset, out, alpha_min=alpha_min, overrides=overrides)
    _print_warnings(caught)
    print(f"wrote {path} (resdecay checkpoint; try: resdecay eval {path})")


def run_export(checkpoint: str, to: str, out: str, ema: bool = False, eval_json: str | None = None,
               license: str | None = None) -> None:
    """``checkpoint`` exported ``to`` timm (one safetensors file), hf (a save_pretrained folder with a model
    card) or hf-vitmae (a transformers ViTMAE folder) at ``out``; ``eval_json`` and ``license`` are the
    card's, refused for the other two."""
    if to == "hf":
        path = export_to_hf(checkpoint, out, ema=ema, eval_json=eval_json, license=license)
        print(f"wrote {path}/ (config.json, model.safetensors, README.md; load it with resdecay.from_pretrained({str(path)!r}), "
              f"share it with resdecay.push_to_hub({str(path)!r}, 'user/name'))")
        return
    for flag, value in (("--eval-json", eval_json), ("--license", license)):
        if value is not None:
            raise UserError(f"{flag} applies to --to hf (a model card); a {to} export has none")
    if to == "hf-vitmae":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DecayDroppedWarning)
            path = export_to_vitmae(checkpoint, out, ema=ema)
        _print_warnings(caught)
        print(f"wrote {path}/ (config.json, model.safetensors; load it with "
              f"transformers.ViTMAEForPreTraining.from_pretrained({str(path)!r}))")
        return
    path = export_to_timm(checkpoint, out, ema=ema)
    print(f"wrote {path} (load it with resdecay.interop.load_exported({str(path)!r}))")
