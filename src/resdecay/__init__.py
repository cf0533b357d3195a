"""resdecay: decayed identity shortcuts, x_{l+1} = alpha_l * x_l + f_l(x_l) (Zhang et al., CVPR 2026)."""

from ._version import __version__
from .nn.blocks import Block
from .nn.decayify import alphas_of, decayify
from .nn.residual import decayed_add, register_shortcut, residual_add, shortcut_names
from .nn.updates import register_update
from .schedule import alpha_schedule, effective_decay, solve_alpha_min

# The notebook API (api.py) is loaded on first use, so ``import resdecay`` stays light.
_API = ("create_model", "load_model", "extract_features", "knn_accuracy", "linear_probe", "effective_rank", "diagnose",
        "attentive_probe", "linear_sweep", "knn_sweep")
_INTEROP = ("save_decayified", "load_decayified", "save_pretrained", "from_pretrained", "push_to_hub")


def __getattr__(name: str):
    if name in _API:
        from . import api  # noqa: PLC0415  (lazy: eval, models and train load only when the API is used)

        return getattr(api, name)
    if name in _INTEROP:
        from . import interop  # noqa: PLC0415  (lazy, as above)

        return getattr(interop, name)
    raise AttributeError(f"module 'resdecay' has no attribute {name!r}")
__all__ = ["alpha_schedule", "effective_decay", "solve_alpha_min", "Block", "decayed_add", "residual_add", "register_shortcut",
           "register_update", "shortcut_names", "decayify", "alphas_of",
           "__version__", *_API, *_INTEROP]
