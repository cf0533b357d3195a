"""An auxiliary objective beside a diffusion family's denoising loss (``train.aux``): REPA or the dispersive
loss (their formulas: ``diffusion/aux_losses.py``), in the same forward as the main loss.

The hidden state of block ``train.aux_layer`` is read by a forward hook on the bare network's block, armed
only inside the training objective: one forward, whatever wraps the network (DDP, torch.compile), and
sampling or online evaluation never store a tensor. U-ViT's time and label tokens come first in its
sequence and are dropped, so both losses see patch tokens only (SiT has no others).

REPA's frozen encoder arrives resolved (``AuxTarget``: the command layer loads it as ``resdecay eval
--model`` does, ``commands/aux_target.py``); here its input is made as REPA makes it: the training images
back to [0, 1] pixels, grey repeated to RGB, normalised with the encoder's statistics and resized
(bicubic) to the side at which its token grid equals the diffusion model's, as REPA feeds DINOv2 224-px
images for SiT's 16x16 tokens at 256 px. An encoder that cannot take that side keeps its own and its
tokens are resampled to the grid (the run's header says so). The encoder is frozen: eval mode, no
gradient, outside the optimizer and the checkpoint (which records its spec in the run config).

The projector is trained: its parameters join the optimizer (after the network's groups), its weights
and the open log windows of the two loss parts are checkpointed (``state``), so a resumed run continues
exactly. Under DDP only the network is wrapped; the projector's gradients are averaged here
(``sync_gradients``). The encoder's forward time is measured apart from the step (``aux_target_s``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ..diffusion.aux_losses import (
    DISPERSIVE_WEIGHT,
    REPA_WEIGHT,
    dispersive_loss,
    repa_loss,
    repa_projector,
)
from ..errors import ConfigError
from ..models import FAMILIES
from ..nn.hyper import streams_of
from .log.runlog import LossWindow

AuxKind = Literal["none", "repa", "dispersive"]


# ----------------------------------------------------------------------------- settings
def check_aux_settings(tc) -> None:
    """``train.aux*`` on their own (``TrainConfig.validate``): one line naming the key and the fix."""
    if tc.aux_weight is not None and tc.aux_weight < 0:
        raise ConfigError(f"train.aux_weight must be >= 0 (null: the paper's), got {tc.aux_weight}")
    if tc.aux_tau <= 0:
        raise ConfigError(f"train.aux_tau must be > 0 (the dispersive loss divides by it), got {tc.aux_tau}")
    if tc.aux_proj_dim < 1:
        raise ConfigError(f"train.aux_proj_dim must be a positive integer (REPA: 2048), got {tc.aux_proj_dim}")
    if tc.aux == "repa" and not tc.aux_target:
        raise ConfigError("train.aux=repa aligns to a frozen encoder and none is named: give train.aux_target=timm:NAME "
                          "or torchvision:NAME (with train.aux_target_weights=FILE), a transformers folder or a "
                          "resdecay MAE checkpoint")
    if not isinstance(tc.aux_target_args, dict) or not all(isinstance(k, str) for k in tc.aux_target_args):
        raise ConfigError(f"train.aux_target_args must be a mapping of constructor arguments like "
                          f"'{{img_size: 32, depth: 4}}', got {tc.aux_target_args!r:.60}")
    if (tc.aux_target_weights or tc.aux_target_args) and not tc.aux_target:
        raise ConfigError("train.aux_target_weights and train.aux_target_args describe train.aux_target; name the "
                          "encoder too (train.aux_target=timm:NAME)")


def model_depth(model_cfg) -> int | None:
    """Blocks of the network a model config describes (what ``train.aux_layer`` indexes)."""
    try:
        depth = model_cfg.num_blocks  # the model contract's count (ModelConfig.num_blocks)
    except (AttributeError, TypeError):  # a plugin family's config that cannot count before it is built
        return None
    return int(depth) if isinstance(depth, int) else None


def check_aux_model(cfg) -> None:
    """``train.aux`` against the model and data (``RunConfig.validate``): a family without diffusion hidden
    states, a block outside the network, REPA on VAE latents (its encoder reads pixels)."""
    tc = cfg.train
    if tc.aux == "none":
        return
    family = FAMILIES.get(cfg.model.family)
    if family is None or not family.diffusion:
        raise ConfigError(f"train.aux={tc.aux} applies to the diffusion families (sit, uvit): model.family "
                          f"{cfg.model.family!r} has no diffusion hidden states to align; set train.aux=none")
    depth = model_depth(cfg.model)
    if tc.aux_layer is not None and depth is not None and not -depth <= tc.aux_layer < depth:
        raise ConfigError(f"train.aux_layer={tc.aux_layer} is outside the network's {depth} blocks: valid are "
                          f"0..{depth - 1} (0-based; or -{depth}..-1 from the end)")
    if streams_of(cfg.model) > 1:  # a block then runs on n streams inside its HyperStep, not by itself
        raise ConfigError(f"train.aux={tc.aux} reads one block's output tokens, but model.hyper_streams="
                          f"{streams_of(cfg.model)} runs the blocks on mixed streams; set model.hyper_streams=1")
    if tc.aux == "repa" and cfg.data.name == "latents":
        raise ConfigError("train.aux=repa feeds the training images to its frozen encoder, but data.name=latents holds "
                          "VAE latents, not pixels; train on pixels or use train.aux=dispersive")


def aux_layer(tc, depth: int) -> int:
    """The 0-based block ``train.aux_layer`` names. None: REPA's rule, the output of block depth//3 counted
    from 1 (its encoder_depth 4 of SiT-B's 12, 8 of SiT-L's 24; SiT-XL used 8 of 28: aux_layer=7), or
    Disperse-Loss's last block (``act[-1]``) for the dispersive loss."""
    if tc.aux_layer is not None:
        return tc.aux_layer % depth
    return max(depth // 3 - 1, 0) if tc.aux == "repa" else depth - 1


def aux_weight(tc) -> float:
    """``train.aux_weight``, or the paper's: REPA's lambda 0.5, Disperse-Loss's 0.25."""
    if tc.aux_weight is not None:
        return float(tc.aux_weight)
    return REPA_WEIGHT if tc.aux == "repa" else DISPERSIVE_WEIGHT


# ----------------------------------------------------------------------------- REPA's frozen encoder
RANDOM_WEIGHTS = "random"  # train.aux_target_weights: a timm / torchvision target's random initialisation, on purpose


@dataclass
class AuxTarget:
    """REPA's frozen encoder, resolved by the command layer (``commands/aux_target.py``).

    Args:
        spec: how it was named (``train.aux_target``); weights: its weights file, ``random`` (its random
            initialisation, asked for), or None (a folder or a checkpoint holds its own).
        encoder: the network (moved to the training device and kept in eval mode here).
        tokens: ``tokens(images) -> (B, N, dim)``: its patch tokens (prefix tokens dropped) of images at
            ``side`` x ``side`` with ``in_chans`` channels, normalised with ``mean`` / ``std``.
        side: the input side chosen so that its token grid is ``grid`` x ``grid`` (the diffusion model's
            when it can be matched).
        grid, dim: its token grid side and token width at ``side``.
        mean, std: its input normalisation of [0, 1] pixels, per channel.
    """

    spec: str
    weights: str | None
    encoder: nn.Module
    tokens: Callable[[torch.Tensor], torch.Tensor]
    side: int
    in_chans: int
    grid: int
    dim: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


class DeviceTimer:
    """Seconds spent in a stretch of work, measured without making the host wait: CUDA events on a GPU
    (read when a log row syncs anyway), ``perf_counter`` on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.pending: list = []
        self.seconds = 0.0

    def start(self):
        if not self.cuda:
            return time.perf_counter()
        begin = torch.cuda.Event(enable_timing=True)
        begin.record()
        return begin

    def stop(self, begin) -> None:
        if not self.cuda:
            self.seconds += time.perf_counter() - begin
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.pending.append((begin, end))

    def take(self) -> float:
        """The seconds since the last ``take`` (waits for the recorded events)."""
        for begin, end in self.pending:
            end.synchronize()
            self.seconds += begin.elapsed_time(end) / 1000
        taken, self.seconds, self.pending = self.seconds, 0.0, []
        return taken


# ----------------------------------------------------------------------------- the objective
class AuxObjective:
    """``train.aux`` of one launch: the hook on block ``layer``, REPA's projector and frozen encoder (or the
    dispersive loss's tau), the loss parts' log windows and the encoder's timer.

    Args:
        tc: the ``TrainConfig``; model: the bare network (``blocks``, ``embed_dim``,
            ``patch_embed.grid``); target: REPA's encoder (None for the dispersive loss).
        pixel_mean, pixel_std: the data's normalisation (the training images are ``(pixels - mean) / std``).
        device: the training device.
    """

    def __init__(self, tc, model: nn.Module, target: AuxTarget | None, pixel_mean, pixel_std, device: torch.device):
        self.kind, self.weight, self.tau = tc.aux, aux_weight(tc), tc.aux_tau
        self.layer = aux_layer(tc, len(model.blocks))
        self.grid = int(model.patch_embed.grid)  # the patch tokens are the last grid**2 of a block's output
        self.device, self.target = device, target
        self.pixel_mean = torch.tensor(pixel_mean, device=device).view(1, -1, 1, 1)
        self.pixel_std = torch.tensor(pixel_std, device=device).view(1, -1, 1, 1)
        self.projector = None
        if target is not None:
            target.encoder.to(device).eval().requires_grad_(False)
            self.enc_mean = torch.tensor(target.mean, device=device).view(1, -1, 1, 1)
            self.enc_std = torch.tensor(target.std, device=device).view(1, -1, 1, 1)
            self.projector = repa_projector(model.cfg.embed_dim, tc.aux_proj_dim, target.dim).to(device)
        self.windows = {"loss_main": LossWindow(device), "loss_aux": LossWindow(device)}
        self.step_parts: dict[str, torch.Tensor] = {}
        self.timer, self.target_s = DeviceTimer(device), 0.0  # target_s: every launch's encoder seconds so far
        self.hidden: torch.Tensor | None = None
        self.armed, self.handle = False, None

    # the network side
    def attach(self, model: nn.Module) -> None:
        """Hook block ``layer`` of the bare network (after the EMA copy is made: the copy must not carry it)."""
        def keep(module, args, out) -> None:
            if self.armed:
                self.hidden = out

        self.handle = model.blocks[self.layer].register_forward_hook(keep)

    def remove(self) -> None:
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer trains besides the network: REPA's projector (none for the dispersive loss)."""
        return list(self.projector.parameters()) if self.projector is not None else []

    def train(self) -> None:
        if self.projector is not None:
            self.projector.train()

    # the step
    @torch.no_grad()
    def target_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """The frozen encoder's patch tokens (B, grid^2, dim) of the clean training images, timed apart."""
        t = self.target
        begin = self.timer.start()
        x = images.float() * self.pixel_std + self.pixel_mean  # back to [0, 1] pixels
        if x.shape[1] == 1 and t.in_chans == 3:
            x = x.expand(-1, 3, -1, -1)  # grey to RGB, as torchvision's Grayscale(3) does
        x = (x - self.enc_mean) / self.enc_std  # REPA: Normalize, then the bicubic resize
        if x.shape[-1] != t.side:
            x = F.interpolate(x, size=(t.side, t.side), mode="bicubic", align_corners=False)
        z = t.tokens(x)
        if t.grid != self.grid:  # an encoder that cannot be fed the matching side: its token map resampled
            z = z.transpose(1, 2).reshape(z.shape[0], t.dim, t.grid, t.grid)
            z = F.interpolate(z.float(), size=(self.grid, self.grid), mode="bilinear", align_corners=False,
                              antialias=t.grid > self.grid)
            z = z.flatten(2).transpose(1, 2)
        self.timer.stop(begin)
        return z

    def loss(self, objective, model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
             scale: float = 1.0) -> torch.Tensor:
        """``scale * (main + weight * aux)`` of one micro-batch, the main loss from ``objective`` and the aux
        term from the hidden state the same forward left at block ``layer``; the parts are kept for the log."""
        target = self.target_tokens(images) if self.target is not None else None
        self.armed = True
        try:
            main = objective(model, images, labels)
        finally:
            self.armed = False
        hidden, self.hidden = self.hidden, None
        if hidden is None:
            raise RuntimeError(f"block {self.layer} did not run in the training forward; train.aux needs it to")
        tokens = hidden[:, hidden.shape[1] - self.grid**2:]  # U-ViT: [time, (label), patches]
        if self.projector is not None:
            aux = repa_loss(self.projector(tokens), target)
        else:
            aux = dispersive_loss(tokens, self.tau)
        for name, part in (("loss_main", main), ("loss_aux", aux)):
            value = part.detach().float() * scale
            self.step_parts[name] = value if name not in self.step_parts else self.step_parts[name] + value
        return (main + self.weight * aux) * scale

    def end_step(self) -> None:
        """The optimizer step is over: its loss parts go into the log windows."""
        for name, value in self.step_parts.items():
            self.windows[name].add(value)
        self.step_parts = {}

    def broadcast(self, env) -> None:
        """Rank 0's projector on every rank, as DDP broadcasts the network's weights when it wraps them (each rank
        drew its own, seeded with its rank)."""
        if env.distributed:
            for t in self.projector.state_dict().values() if self.projector is not None else ():
                dist.broadcast(t, 0)

    def sync_gradients(self, env) -> None:
        """The projector's gradients averaged over the ranks (DDP wraps the network only)."""
        if not env.distributed:
            return
        for p in self.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= env.world_size

    # the log, the checkpoint, the summary
    def row(self, env) -> dict:
        """The log row's parts: the window's mean main and (unweighted) aux loss, the encoder's seconds."""
        row = {name: w.close(env)[0] for name, w in self.windows.items()}
        if self.target is not None:
            seconds = self.timer.take()
            self.target_s += seconds
            row["aux_target_s"] = seconds
        return row

    def state(self, windows: list) -> dict:
        """The checkpoint's ``aux`` part: the projector's weights, every rank's open windows (``windows``,
        gathered from ``window_state``), the encoder's seconds so far."""
        self.target_s += self.timer.take()
        out = {"kind": self.kind, "windows": windows, "target_s": self.target_s}
        if self.projector is not None:
            out["projector"] = self.projector.state_dict()
        return out

    def window_state(self) -> dict:
        """This rank's open windows of the loss parts (for ``state``)."""
        return {name: w.state() for name, w in self.windows.items()}

    def load(self, state: dict | None, rank: int, world_size: int) -> None:
        """Continue a checkpoint's ``aux`` part (None: a checkpoint without one starts the windows empty)."""
        if not state:
            return
        if self.projector is not None and "projector" in state:
            self.projector.load_state_dict(state["projector"])
        windows = state.get("windows") or []
        if len(windows) == world_size:
            for name, w in self.windows.items():
                w.load(windows[rank].get(name))
        self.target_s = float(state.get("target_s") or 0.0)

    def summary(self) -> dict:
        """summary.json's ``aux``: the settings in force and, for REPA, the encoder and its time."""
        out = {"kind": self.kind, "weight": self.weight, "layer": self.layer}
        if self.kind == "dispersive":
            return {**out, "tau": self.tau}
        t = self.target
        self.target_s += self.timer.take()
        return {**out, "proj_dim": self.projector[0].out_features, "target": t.spec, "target_weights": t.weights,
                "target_side": t.side, "target_grid": t.grid, "grid": self.grid,
                "tokens_resampled": t.grid != self.grid, "target_s": self.target_s}

    def describe(self) -> str:
        """One header line: what is added to the loss, and how the encoder's tokens meet the grid."""
        head = f"aux {self.kind}: weight {self.weight:g} on block {self.layer} (0-based)"
        if self.target is None:
            return f"{head}, tau {self.tau:g}"
        t = self.target
        meet = (f"its {t.grid}x{t.grid} tokens equal the model's grid" if t.grid == self.grid else
                f"its {t.grid}x{t.grid} tokens resampled (bilinear) to the model's {self.grid}x{self.grid}: it cannot "
                f"take a side that gives them")
        weights = ", random weights (seed 0)" if t.weights == RANDOM_WEIGHTS else ""
        return (f"{head}, projector {self.projector[0].out_features} wide, target {t.spec}{weights} at {t.side} px "
                f"({meet})")
