"""Block adapters: how ``decayify`` reaches the residual adds of each library's blocks.

One file per library (``resdecay_blocks``, ``timm_blocks``, ``torchvision_blocks``,
``transformers_blocks``, ``diffusers_blocks`` with ``diffusers_mmdit`` and ``diffusers_unet``), each registering
``BlockAdapter``s built from the three mechanisms in ``hooks``; a user's own block kind is one ``register_adapter``
call (docs/EXTENDING.md). ``depth_order`` holds the models whose blocks do not run in registration order (U-Nets);
``traced`` reaches, by tracing, the blocks of a stack no adapter names (tried after every registered adapter);
``fused`` rewrites a hooked block's adds into one fused add each where its traced forward proves the roles.
No library is imported here: blocks are matched by class name and module. The order adapters are
tried in is each adapter's ``priority`` (``registry.py``), not the order of the imports below.
"""

from . import (  # noqa: F401
    diffusers_blocks,
    diffusers_mmdit,
    diffusers_unet,
    fused,
    resdecay_blocks,
    roles_check,
    timm_blocks,
    torchvision_blocks,
    transformers_blocks,
)
from .depth_order import DepthOrder, depth_order_for, depth_orders, register_depth_order, unregister_depth_order
from .registry import (
    AT_RESIDUAL_ADD,
    BlockAdapter,
    Role,
    adapter_for,
    adapters,
    forward_adapter,
    nearest_supported,
    register_adapter,
    shortcut_adapter,
    subblock_adapter,
    unregister_adapter,
)

__all__ = ["AT_RESIDUAL_ADD", "BlockAdapter", "Role", "DepthOrder", "adapter_for", "adapters", "depth_order_for", "forward_adapter",
           "nearest_supported", "option_choices", "register_adapter", "register_depth_order", "shortcut_adapter",
           "subblock_adapter", "unregister_adapter", "unregister_depth_order"]


def option_choices() -> dict[str, tuple]:
    """Every ``decayify`` keyword a registered adapter or depth order declares, with its choices (default first)."""
    out: dict[str, tuple] = {}
    for owner in [*adapters(), *depth_orders()]:
        out.update(owner.options)
    return out
