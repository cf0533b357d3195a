"""The model contract: what the trainer, the evaluators, the stability monitor and interop read
from a model and from its config, written down as types instead of ``getattr(model, "...", default)``.

``ModelConfig`` is the base of every family's config dataclass: the members the trainer and the
data pipeline read from ``cfg.model`` whatever the family. It adds no dataclass fields (the fields,
and so the checkpoint's ``config`` keys, stay each family's own).

``ResidualModel`` is the protocol every family's network satisfies (checked for every registered
family by ``tests/models/test_contract.py``):

    cfg                  the config the blocks were built from (img_size, in_chans, alpha_min, ...)
    blocks               the encoder / backbone residual blocks, in network order (an nn.ModuleList)
    decoder_blocks       the decoder's residual blocks; empty when the family has no decoder
    num_blocks           len(blocks): what block indices count
    alphas               the shortcut-factor table in use, one row per block
    forward_intermediates(x, *conditioning, indices=None)
                         the outputs of the requested 0-indexed blocks (negative counts from the
                         end; None = the last); ``conditioning`` is empty for image encoders and
                         ``(t, y)`` for diffusion backbones
    forward_features(x, *conditioning)
                         the last block's output tokens (B, T, D), raw: what evaluation pools
    flops_per_sample()   analytic forward FLOPs of one sample (for MFU)
    __call__             the forward the family's registered objective calls; the trainer never
                         calls a model method other than forward, so DDP and torch.compile wrappers
                         see every training forward
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn as nn


class ModelConfig:
    """Base of every family's config (a dataclass subclass supplies the fields).

    Members read by the trainer, the data pipeline and the evaluators, whatever the family:
    ``family``, ``img_size`` and ``in_chans`` (the input the data pipeline must produce),
    ``alpha_min`` and ``schedule`` (the decay, for logs and summaries), ``num_blocks``, ``skips``
    and ``validate()``. A family whose config does not hold one of them as a field answers it from
    what it does hold (a classifier from its pretrained encoder's config, a ResNet from its stages).
    """

    family: str
    img_size: int
    in_chans: int
    alpha_min: float
    schedule: str
    # Whether encoder->decoder long skips are on; None for a family that has no such switch. A
    # plain class attribute, not a field: families with the switch declare their own ``skips`` field.
    skips: bool | None = None

    @property
    def num_blocks(self) -> int:
        """Residual blocks the decay runs over (``model.depth`` unless the family counts otherwise)."""
        return self.depth

    @property
    def token_grid(self) -> tuple[int, int] | None:
        """(rows, columns) of the patch tokens the blocks see, in raster order after any cls token; None
        for a family without patch tokens (a ResNet's feature maps). Patch families override it."""
        return None

    def validate(self) -> None:
        """Raise ValueError / ConfigError, in one line, for settings the family cannot build."""

    def warnings(self) -> list[str]:
        """Settings that build but silently do (almost) nothing, one line each (printed at the start)."""
        return []


@runtime_checkable
class ResidualModel(Protocol):
    """What every registered family's network provides; see the module docstring."""

    cfg: ModelConfig
    blocks: nn.ModuleList
    decoder_blocks: nn.ModuleList
    num_blocks: int
    alphas: torch.Tensor

    def forward_intermediates(self, x: torch.Tensor, *conditioning, indices: list[int] | None = None) -> list[torch.Tensor]:
        ...

    def forward_features(self, x: torch.Tensor, *conditioning) -> torch.Tensor:
        ...

    def flops_per_sample(self) -> float:
        ...

    def __call__(self, *args, **kwargs):
        ...


def missing_members(model: object) -> list[str]:
    """The ``ResidualModel`` members ``model`` lacks (empty when it satisfies the contract), for an
    error message that names them instead of a bare ``isinstance`` False."""
    members = [*ResidualModel.__annotations__, "forward_intermediates", "forward_features", "flops_per_sample"]
    return [m for m in members if not hasattr(model, m)]
