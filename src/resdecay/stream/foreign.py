"""A model trained elsewhere, behind the model contract the evaluators read.

``resdecay eval`` measures a resdecay checkpoint through ``model.forward_intermediates``, ``model.blocks``
and ``model.cfg``. ``ForeignEncoder`` gives any timm / torchvision / transformers / diffusers model the
same members: its residual stream's blocks are found as ``decayify`` finds them (the adapters,
``sites.stream_blocks``), a block's output is read by a forward hook, and the model is run
as the diagnostics run it (``runner.model_runner``: a transformers MAE unmasked, a
diffusers backbone with a fixed timestep and class). A model whose blocks no adapter reaches is refused
in one line. ``ForeignRun`` stands in for the ``RunConfig`` of a checkpoint: the model's shape, the data
the user named, and the seed of the random-init baseline (the same architecture, freshly initialised).

Loading the file (a timm name with a weights file, a transformers or diffusers folder, a
``save_decayified`` file) is ``interop/foreign_model.py``'s; this module takes the built model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from ..errors import UserError, one_line
from ..io import first_sentence
from ..nn.decayify import alphas_of, residual_blocks
from .record import as_tokens, first_tensor
from .runner import model_runner
from .sites import channels_first, patch_size_of, stream_blocks


@dataclass
class ForeignModelConfig:
    """What the evaluators read as ``cfg.model`` of a model trained elsewhere.

    Args:
        source: how it was named (``timm:vit_small_patch16_224``, a folder, ...); weights: the file read, or None.
        img_size, in_chans: the input the data pipeline must produce.
        patch_size: the patch side (None: no patch tokens, e.g. a CNN's feature maps).
        prefix_tokens: tokens before the patch tokens (cls, registers); 0 for a model without a cls token.
        alpha_min, schedule: the decay found on its blocks (1 and "none" when it is not decayified).
        conditioning: the fixed values a diffusion backbone takes after x (timestep, class).
    """

    source: str
    weights: str | None
    img_size: int
    in_chans: int
    patch_size: int | None
    prefix_tokens: int
    alpha_min: float = 1.0
    schedule: str = "none"
    conditioning: tuple = ()
    family: str = "foreign"
    skips = None

    @property
    def token_grid(self) -> tuple[int, int] | None:
        """(rows, columns) of the patch tokens, after the prefix tokens."""
        if self.patch_size is None:
            return None
        side = self.img_size // self.patch_size
        return side, side


@dataclass
class ForeignTrain:
    """The one training field an evaluation reads: the seed the random-init baseline is drawn with."""

    seed: int = 0


@dataclass
class ForeignRun:
    """The ``RunConfig`` stand-in of a foreign model's evaluation.

    Args:
        model: its ``ForeignModelConfig``; data: the data set measured (``--data``).
        build: a function of no arguments that builds the same architecture with fresh weights.
    """

    model: ForeignModelConfig
    data: object
    build: Callable[[], nn.Module] = field(repr=False, compare=False, default=None)
    train: ForeignTrain = field(default_factory=ForeignTrain)
    preset: str = "foreign"

    @property
    def label(self) -> str:
        m = self.model
        decay = "plain" if m.alpha_min == 1.0 else f"alpha_min {m.alpha_min:g}, {m.schedule}"
        return f"{m.source} ({decay})"

    def to_dict(self) -> dict:
        return {"model": dataclasses.asdict(self.model), "data": dataclasses.asdict(self.data),
                "train": dataclasses.asdict(self.train), "preset": self.preset}

    def random_init(self) -> ForeignEncoder:
        """The same architecture freshly initialised (seeded by the caller), wrapped as the model was."""
        m = self.model
        return ForeignEncoder(self.build(), m.source, m.weights, m.img_size, m.in_chans, m.conditioning)


def installed_decay(model: nn.Module) -> tuple[float, str]:
    """(alpha_min, schedule) of the decay installed anywhere in ``model``, for its label and protocol card.

    alpha_min is the smallest alpha its residual adds use now (``alphas_of``: what the numbers were measured
    with), so a decay on a part -- ``decayify(mae.vit)``, a restored ``unet_skips`` folder -- is not read as
    "plain". The schedule is the one ``decayify`` recorded (``resdecay_spec``) on the module it was given,
    named when that is a part (``linear on vit``); ``unrecorded`` where alphas differ from 1 without a record.
    (1, "none") when every add keeps alpha 1.
    """
    lowest = min((v for _, a in alphas_of(model) for v in a), default=1.0)
    if lowest == 1.0:
        return 1.0, "none"
    specs = [(name, m.resdecay_spec) for name, m in model.named_modules() if getattr(m, "resdecay_spec", None)]
    parts = [f"{spec.get('schedule', 'linear')}{f' on {name}' if name else ''}" for name, spec in specs]
    return float(lowest), "; ".join(parts) or "unrecorded"


class ForeignEncoder(nn.Module):
    """A timm / torchvision / transformers / diffusers model as a resdecay encoder: ``blocks``,
    ``forward_intermediates``, ``forward_features`` and ``cfg`` (``ForeignModelConfig``).

    Args:
        model: the network (decayified or not).
        source, weights: how it was named and the file its weights came from (for the report).
        img_size, in_chans: its input (a transformers / diffusers config or a timm model states them
            when None).
        conditioning: fixed values a diffusion backbone takes after x, e.g. ``(500, 0)``.
        container: the module holding the stream's blocks (default: the first that holds any).
    """

    def __init__(self, model: nn.Module, source: str, weights: str | None = None, img_size: int | None = None,
                 in_chans: int | None = None, conditioning: tuple = (), container: str | None = None):
        super().__init__()
        self.model = model
        img_size, in_chans = img_size or _input_side(model), in_chans or _input_chans(model)
        if img_size is None or in_chans is None:  # a CNN takes any side: the side to read the images at
            missing = " and ".join(f"--model-arg {k}" for k, v in (("img_size=N", img_size), ("in_chans=C", in_chans))
                                   if v is None)
            raise UserError(f"{source}: its input {'size' if img_size is None else 'channels'} is not recorded in the "
                            f"model; pass {missing} (a CNN reads any side: the side its images were trained at)")
        patch = patch_size_of(model)
        alpha_min, schedule = installed_decay(model)
        self.cfg = ForeignModelConfig(source, weights, int(img_size), int(in_chans), patch[0] if patch else None,
                                      0, alpha_min, schedule, tuple(conditioning))
        self._blocks = [b for _, b in stream_blocks(model, container)]  # a plain list: registered once, under ``model``
        probe = self._probe()
        if probe[0].dim() == 3 and self._maps and container is None:  # a CNN: its stages are one stream of blocks
            self._blocks = [b for _, b, _ in residual_blocks(model)]
            self.cfg.patch_size = None
        grid = self.cfg.token_grid
        self.cfg.prefix_tokens = probe[0].shape[1] - (grid[0] * grid[1] if grid else probe[0].shape[1])

    _maps = False  # the blocks return feature maps (a CNN), not token sequences

    @torch.no_grad()
    def _probe(self) -> list[torch.Tensor]:
        """The first block's output on one zero image, or one line: a model that cannot run on the input and the
        conditioning it was given (an index error deep in a class embedding, an attention mask of the wrong dtype)
        is refused here, before a feature is extracted."""
        c = self.cfg
        try:
            return self.forward_intermediates(torch.zeros(1, c.in_chans, c.img_size, c.img_size), [0])
        except Exception as e:  # noqa: BLE001  (whatever the model's own code raises: it is reported, not hidden)
            given = ["img_size", "in_chans"] + (["timestep", "class_label"] if c.conditioning else [])
            cond = f" with conditioning {tuple(c.conditioning)}" if c.conditioning else ""
            raise UserError(f"{c.source}: a forward pass on a {c.in_chans}x{c.img_size}x{c.img_size} image{cond} fails "
                            f"({first_sentence(one_line(e))}); check --model-arg {' / '.join(given)}") from None

    @property
    def blocks(self) -> list[nn.Module]:
        """The residual stream's blocks, in depth order."""
        return self._blocks

    @property
    def alphas(self) -> list[list[float]]:
        return [list(a) for _, a in alphas_of(self.model)]

    def forward_intermediates(self, x: torch.Tensor, indices: list[int] | None = None) -> list[torch.Tensor]:
        """The (B, T, D) outputs of the requested blocks (negative counts from the end; None: the last)."""
        n = len(self._blocks)
        wanted = [i % n for i in (indices if indices is not None else [-1])]
        outs: dict[int, torch.Tensor] = {}

        def keep(i: int, out) -> None:
            t = first_tensor(out)
            self._maps = t.dim() == 4  # feature maps, (B, C, H, W) or Swin's (B, H, W, C), read as tokens
            outs[i] = as_tokens(t, channels_first(self._blocks[i]))

        handles = [self._blocks[i].register_forward_hook(lambda m, a, o, i=i: keep(i, o)) for i in sorted(set(wanted))]
        try:
            with model_runner(self.model, self.cfg.conditioning) as run:
                run(x)
        finally:
            for h in handles:
                h.remove()
        return [outs[i] for i in wanted]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_intermediates(x, [-1])[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_features(x)


def _input_side(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)  # transformers / diffusers configs
    for key in ("image_size", "sample_size"):
        v = getattr(cfg, key, None)
        if v is not None:
            return int(v if isinstance(v, int) else v[0])
    embed = getattr(model, "patch_embed", None)  # timm
    size = getattr(embed, "img_size", None)
    return int(size[0]) if size is not None else None


def _input_chans(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    for key in ("num_channels", "in_channels"):
        v = getattr(cfg, key, None)
        if v is not None:
            return int(v)
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)  # the stem / patch projection
    return conv.in_channels if conv is not None else None


def stream_model(model: nn.Module) -> tuple[nn.Module, tuple]:
    """(the network whose residual stream is read, the fixed conditioning it runs with): a ``ForeignEncoder``'s
    library model and its conditioning (the report names the library's blocks), any other model as it is."""
    if isinstance(model, ForeignEncoder):
        return model.model, model.cfg.conditioning
    return model, ()
