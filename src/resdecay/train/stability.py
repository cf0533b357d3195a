"""A stability guardrail: the token RMS of every block's output, logged at each log step, and one
warning when a block's RMS grows by more than ``train.norm_growth_warn`` within
``train.norm_growth_window`` log steps, before the loss turns non-finite.

Why: with a decayed shortcut (x_{l+1} = alpha_l x_l + f_l(x_l)) the branches can learn to out-shout
the shrinking identity path; the paper (§3) names this the failure mode of alpha_min <= 0.7 without
zero-initialised branches: feature norms explode, then the loss goes NaN. The norms move first, so
watching them turns a lost run into a warning with a fix.

Cost: forward hooks that are idle except on the one optimizer step that ends at a log step; then
each block's output (already computed by the forward) is reduced to one number on the device. The
numbers are read on the host at the log step, where the loop already waits for the device to read the
loss, so no extra forward and no extra stall.
"""

from __future__ import annotations

from collections import deque

import torch
import torch.nn as nn

from ..models import ResidualModel
from ..nn.hyper import block_steps

FIX = "usual fixes: raise model.alpha_min (e.g. 0.6 -> 0.7), keep model.zero_init=true, lower train.base_lr"


def named_blocks(model: ResidualModel) -> list[tuple[str, nn.Module]]:
    """The residual blocks of any resdecay family (the model contract's ``blocks``, encoder /
    backbone, and ``decoder_blocks``, empty but for the MAE), named as a user would look them up. With
    hyper-connections (``nn.hyper``) a block runs through its ``HyperStep``, whose output is the block's n streams."""
    encoder = block_steps(model)
    decoder = list(model.decoder_blocks)
    if not decoder:
        return [(f"block {i}", b) for i, b in enumerate(encoder)]
    return [(f"encoder block {i}", b) for i, b in enumerate(encoder)] + [(f"decoder block {j}", b) for j, b in enumerate(decoder)]


class BlockNormMonitor:
    """Per-block token RMS of the outputs, sampled on armed steps, with a one-time growth warning.

    Args:
        model: the raw (unwrapped) model; hooks go on its blocks.
        growth: warn when a block's RMS exceeds ``growth`` times its smallest value over the window.
            0 turns the warning off (the RMS is still logged).
        window: how many log steps back the smallest value is taken from.
    """

    def __init__(self, model: ResidualModel, growth: float = 20.0, window: int = 5):
        named = named_blocks(model)
        self.names, blocks = [n for n, _ in named], [b for _, b in named]
        self.growth, self.window = growth, window
        self.armed = False
        self.warned = False
        self._sq = None  # (num_blocks,) summed mean squares of this step's micro-batches, on the device
        self._count = 0
        self.history: deque[list[float]] = deque(maxlen=window)
        self._handles = [b.register_forward_hook(self._hook(i)) for i, b in enumerate(blocks)]

    def _hook(self, i: int):
        def record(module, inputs, output):
            if not (self.armed and module.training):
                return
            out = output[0] if isinstance(output, (tuple, list)) else output
            out = out.detach()
            ms = torch.linalg.vector_norm(out, dtype=torch.float32).square() / out.numel()  # mean square
            if self._sq is None:
                self._sq = torch.zeros(len(self.names), device=out.device)
            self._sq[i] += ms
            if i == 0:
                self._count += 1
        return record

    def arm(self) -> None:
        """Record the next forward passes (the micro-batches of the step that ends at a log step)."""
        self.armed = True

    def read(self) -> list[float] | None:
        """This armed step's per-block RMS (host floats; read with the loss), and disarm."""
        self.armed = False
        if self._sq is None or not self._count:
            return None
        rms = (self._sq / self._count).sqrt().tolist()
        self._sq.zero_()
        self._count = 0
        return rms

    def check(self, rms: list[float], step: int) -> str | None:
        """The warning line, once per run, when a block's RMS grew more than ``growth``x within the
        window (or is no longer finite); else None."""
        warning = None
        if self.growth and not self.warned and self.history:
            # Growth is measured from the block's window low, but never from below the first block's
            # (the input tokens' scale): zero-initialised branches behind a decayed shortcut start
            # deep blocks near 0 and legitimately grow 100x to ordinary size early in training.
            floor = min(h[0] for h in self.history)
            for i, now in enumerate(rms):
                low = min(h[i] for h in self.history)
                ref = max(low, floor)
                if not now < float("inf") or (ref > 0 and now > self.growth * ref):
                    grew = "is no longer finite" if not now < float("inf") else f"grew {now / low:.0f}x ({low:.3g} -> {now:.3g})"
                    warning = (f"warning: token RMS of {self.names[i]}'s output {grew} within the last "
                               f"{len(self.history)} log steps (step {step}); training may be about to diverge. {FIX}")
                    self.warned = True
                    break
        self.history.append(rms)
        return warning

    def report(self, step: int, say) -> dict:
        """At a log step: ``{"block_rms": [...]}`` for the log row (empty if nothing was recorded),
        after saying the growth warning if this step triggers it."""
        rms = self.read()
        if rms is None:
            return {}
        warning = self.check(rms, step)
        if warning:
            say("\n" + warning)
        return {"block_rms": [round(r, 5) for r in rms]}

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
