"""A ``--model`` format of your own: ``zoo:NAME`` builds one of your lab's named architectures, then loads
``--weights`` (a state_dict, or a training checkpoint holding one under ``model`` / ``state_dict``).

    resdecay --plugin docs/examples/extending/model_format.py eval --model zoo:digits-vit --weights W.pth --data digits

``resdecay eval`` then measures it as it measures a timm name or a Hugging Face folder: kNN, probe, rank,
the per-layer profile, the diagnostics, with the raw-pixel and random-init baselines (the random-init
encoder is ``fresh()``, seeded by the evaluation).
"""

from __future__ import annotations

import timm

from resdecay.errors import UserError
from resdecay.interop.checkpoint_io import load_strict, read_weights_file, state_dict_of
from resdecay.interop.foreign_model import ModelFormat, register_model_format

# name -> constructor: the architectures your code trains (here: timm ViTs at the sizes your runs used)
ZOO = {
    "digits-vit": dict(img_size=8, patch_size=2, in_chans=1, depth=3, embed_dim=32, num_heads=2),
    "digits-vit-deep": dict(img_size=8, patch_size=2, in_chans=1, depth=6, embed_dim=32, num_heads=2),
}


def load_zoo(spec: str, weights: str | None, model_args: dict):
    """``(model with its weights, fresh)`` for ``zoo:NAME``; ``--model-arg`` values override the zoo's."""
    name = spec.partition(":")[2]
    if name not in ZOO:
        raise UserError(f"--model {spec}: no such architecture in the zoo; choose one of {', '.join(ZOO)}")

    def fresh():
        return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, **{**ZOO[name], **model_args})

    model = fresh()
    if weights is not None:
        load_strict(model, state_dict_of(read_weights_file(weights), weights), weights)  # every key, or one line
    return model, fresh


register_model_format(ModelFormat("zoo", load_zoo, "zoo:NAME", takes_weights=True), replace=True)
