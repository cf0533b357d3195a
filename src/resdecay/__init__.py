"""resdecay: decayed identity shortcuts, x_{l+1} = alpha_l * x_l + f_l(x_l) (Zhang et al., CVPR 2026)."""

from .schedule import alpha_schedule, effective_decay, solve_alpha_min
from .blocks import Block, decayed_add
from .decayify import alphas_of, decayify
from .interop import load_decayified, save_decayified

__version__ = "0.1.0"
__all__ = ["alpha_schedule", "effective_decay", "solve_alpha_min", "Block", "decayed_add", "decayify", "alphas_of",
           "save_decayified", "load_decayified",
           "__version__"]
