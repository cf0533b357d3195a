"""diffusers' U-Nets (``UNet2DModel``, ``UNet2DConditionModel``): their ``ResnetBlock2D``, the residual
``Attention`` of ``UNet2DModel``'s attention blocks, and the U-Net's own order of depth.

* ``ResnetBlock2D`` (and ``ResnetBlockCondNorm2D``): ``(shortcut(x) + h) / output_scale_factor`` becomes
  ``(alpha * shortcut(x) + h) / output_scale_factor``: a hook scales ``conv_shortcut``'s output, or a
  parameter-free ``ShortcutScale`` fills its None place (the forward calls ``conv_shortcut`` whenever it is
  not None). One add.
* ``Attention(residual_connection=True)`` (``AttnDownBlock2D``, ``UNetMidBlock2D``, ... of ``UNet2DModel``):
  its processor returns ``(f(x) + x) / rescale_output_factor``, the add inside the processor, where no module
  sees it. The forward is replaced by the library's (which calls the processor) followed by the correction
  form of the add: minus ``(1 - alpha) * x / rescale_output_factor`` (as the hooks' correction: alpha * x + f(x)
  up to float rounding; at alpha = 1 it subtracts 0, the library's output bit for bit). Every processor of
  diffusers that honours ``residual_connection`` adds the forward's own input x. One add.
* ``BasicTransformerBlock`` (``UNet2DConditionModel``'s cross-attention blocks) keeps its adapter
  (diffusers_blocks.py, 2 adds: self-attention and feed-forward; the cross-attention add stays at 1).
  ``Transformer2DModel``'s own outer add (``proj_out(...) + x`` around its blocks) stays at alpha 1: an adapter
  taking the ``Transformer2DModel`` would hide its ``BasicTransformerBlock``s from the block search, one adapter
  has one number of adds while ``transformer_layers_per_block`` varies (SDXL: 1, 2, 10), and with
  ``use_linear_projection`` the add's operand is ``proj_out``'s output reshaped, which no module outputs.

Every one of these allows mixed add counts: one-add ResNet blocks and two-add transformer blocks share one
schedule over the adds in depth order (paper: "in diffusion models the decay runs through all blocks and ends at
the last decoder block"). diffusers registers a U-Net's parts down, up, mid, and each block's ``attentions``
before its ``resnets``; the forward runs down -> mid -> up, resnet then attention. ``UNET_DEPTH`` orders the
blocks as the forward runs them; ``decayify(unet, alpha_min, unet_depth="encoder")`` decays the down and mid
blocks only (ending at the mid block) and keeps the up blocks at alpha 1, as the paper's MAE decays its encoder
and its decoder receives the skips.
"""

from __future__ import annotations

import inspect
import math

from ..residual import scale_branch
from .depth_order import DepthOrder, register_depth_order
from .registry import Role, forward_adapter, register_adapter, shortcut_adapter

UNET_OPTIONS = {"unet_depth": ("forward", "encoder")}  # default first: the whole U-Net on one schedule

register_adapter(shortcut_adapter(
    "diffusers ResnetBlock2D (U-Net)", ("diffusers.models.resnet:ResnetBlock2D", "diffusers.models.resnet:ResnetBlockCondNorm2D"),
    shortcut="conv_shortcut", branch_end=lambda b: b.conv2, zero=lambda b: (b.conv2,),
    accepts=lambda b: all(hasattr(b, n) for n in ("conv_shortcut", "conv2", "output_scale_factor")),
    mixed_adds=True))


def residual_attention_forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None,
                               **cross_attention_kwargs):
    """``Attention.forward`` (diffusers 0.4x: the keywords its processor takes, then the processor) with
    ``residual_connection``: the processor's ``(f(x) + x) / r`` made ``(beta * f(x) + alpha * x) / r``
    (r = ``rescale_output_factor``). The processor is called as the library's forward calls it (not through
    ``type(self).forward``, which torch.compile cannot trace in a class diffusers marks allow_in_graph)."""
    (a,), (b,) = self.resdecay_factors
    takes = set(inspect.signature(self.processor.__call__).parameters)
    kwargs = {k: w for k, w in cross_attention_kwargs.items() if k in takes}
    out = self.processor(self, hidden_states, encoder_hidden_states=encoder_hidden_states,
                         attention_mask=attention_mask, **kwargs)
    return scale_branch(out, b) - ((b - a) / self.rescale_output_factor) * hidden_states


register_adapter(forward_adapter(
    "diffusers Attention, residual_connection (U-Net attention block)", ("diffusers.models.attention_processor:Attention",),
    residual_attention_forward, adds=1, zero=lambda b: (b.to_out[0],),
    accepts=lambda b: getattr(b, "residual_connection", False) is True and hasattr(b, "rescale_output_factor"),
    mixed_adds=True, reads=lambda b: [Role(b, b.to_out[-1])]))  # x enters the block, f leaves to_out (then the add)


def _part_key(rel: str, position: int) -> tuple:
    """Where a block sits in its down / mid / up block's forward: resnet i, then attention i (a mid block:
    resnet 0, attention 0, resnet 1, ...), then anything else (the resnet down- / upsamplers) as registered."""
    head, _, rest = rel.partition(".")
    index = rest.partition(".")[0]
    if head in ("resnets", "attentions") and index.isdigit():
        return (int(index), head == "attentions", position)
    return (math.inf, 0, position)


def unet_order(model, found, options):
    """down_blocks, mid_block, up_blocks, each block's parts as its forward runs them.

    Args:
        model: the U-Net; found: its supported blocks (name, block, adapter name) in registration order;
        options: ``unet_depth``: "forward" (everything on the schedule) or "encoder" (up blocks at alpha 1).

    Returns:
        (scheduled, plain). Blocks outside the down, mid and up blocks (none in diffusers' U-Nets) stay plain.
    """
    parts = [f"down_blocks.{i}" for i in range(len(model.down_blocks))]
    parts += ["mid_block"] if getattr(model, "mid_block", None) is not None else []
    ups = [f"up_blocks.{i}" for i in range(len(model.up_blocks))]
    ordered, placed = {}, set()
    for part in parts + ups:
        mine = [(i, e) for i, e in enumerate(found) if e[0].startswith(part + ".")]
        mine.sort(key=lambda ie: _part_key(ie[1][0][len(part) + 1:], ie[0]))
        ordered[part] = [e for _, e in mine]
        placed.update(i for i, _ in mine)
    rest = [e for i, e in enumerate(found) if i not in placed]
    encoder = [e for p in parts for e in ordered[p]]
    decoder = [e for p in ups for e in ordered[p]]
    if options.get("unet_depth", "forward") == "encoder":
        return encoder, decoder + rest
    return encoder + decoder, rest


register_depth_order(DepthOrder(
    "diffusers U-Net: down, mid, up", ("diffusers.models.unets:UNet2DModel", "diffusers.models.unets:UNet2DConditionModel"), unet_order,
    options=UNET_OPTIONS))
