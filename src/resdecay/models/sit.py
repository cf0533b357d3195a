"""SiT (Ma et al., 2024): a DiT-style transformer with adaLN-Zero blocks on patch tokens, here with
decayed identity shortcuts and additive encoder->decoder long skips (paper-notes §3).

    plain SiT (= DiT's network)   alpha_min=1,   skips=False
    decayed SiT (the paper's)     alpha_min=0.8, skips=True

Block i uses row i of the shortcut formula's factors (``model.shortcut``; the default decay is
``alpha_schedule(depth, alpha_min)[i]``): the decay runs through the whole network and reaches
alpha_min at the last block (paper-notes §1, §3).

The conditioning pieces (timestep / label embedders, adaLN-Zero block, final layer) are DiT's and
live in ``resdecay.nn.conditioning``; this file is the network, read top to bottom like DiT's.

Shapes: images (B, C, H, W); N = (H/p)^2 patch tokens of width D; c = (B, D) conditioning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn as nn

from ..diffusion.objectives import NoiseSchedule, Objective
from ..errors import ConfigError
from ..nn.blocks import block_flops, init_linear_xavier, init_patch_embed, sincos_pos_embed_2d, unpatchify
from ..nn.branch_scale import BranchScale, branch_block_kwargs, check_branch_settings, starts_silent
from ..nn.conditioning import AdaLNBlock, FinalLayer, embed_labels
from ..nn.hyper import HyperVariant, check_hyper, expand_streams, hyper_streams, reduce_streams, run_block
from ..nn.residual import check_shortcut, shortcut_plan
from ..schedule import Branches, Schedule
from .common import (
    GradCheckpointing,
    check_diffusion_config,
    diffusion_batch,
    diffusion_objective,
    diffusion_stem,
    resolve_blocks,
)
from .contract import ModelConfig
from .registry import register_family


@dataclass
class SiTConfig(ModelConfig):
    family: str = "sit"
    img_size: int = 32  # square input side (32x32x4 VAE latents of 256-px images)
    in_chans: int = 4
    patch_size: int = 2
    embed_dim: int = 384  # SiT-S/2; B: 768 x 12; XL: 1152 x 28 / 16 heads
    depth: int = 12  # total blocks; with skips: even, split into two halves
    num_heads: int = 6
    mlp_ratio: float = 4.0
    qkv_bias: bool = True  # as DiT / SiT
    num_classes: int = 0  # 0 = unconditional; otherwise label num_classes is the null label (CFG)
    class_dropout: float = 0.1  # training-time probability of replacing a label with the null label
    alpha_min: float = 1.0  # shortcut factor of the last sub-block (paper: 0.8 for SiT-XL/2); 1 = plain
    schedule: Schedule = "linear"  # see resdecay.schedule
    shortcut: str = "decay"  # a registered formula (resdecay.nn.residual): decay | learnable | scaled_sum | scaled_branch
    decay_branches: Branches = "both"  # both | attn | mlp: which sub-blocks the formula applies to (Table 3b)
    branch_scale: BranchScale = "none"  # none | rezero | layerscale | skipinit: a gain on every branch (nn.branch_scale)
    layerscale_init: float = 1e-5  # LayerScale's initial gain epsilon (CaiT: 1e-5 deep, 0.1 shallow)
    drop_branch: float = 0.0  # stochastic depth on the branch (DropPath): the last block's rate, linear in depth
    drop_identity: float = 0.0  # stochastic depth on the shortcut instead: the last block's rate, linear in depth
    skips: bool = True  # additive long skips between mirrored halves (paper-notes §3)
    zero_init: bool = False  # zero the skip Linears; False = the authors' xavier weights, zero bias
    #                          (adaLN-Zero and the zero final layer are always on)
    gelu: Literal["tanh", "exact"] = "tanh"  # MLP activation: tanh approximation as DiT / SiT / the authors
    objective: Objective = "interp-v"  # stored for the loss/sampler module: ddpm-eps | interp-v (SiT's)
    noise_schedule: NoiseSchedule = "linear"  # stored only: linear | cosine (DDPM betas / interpolant path)
    grad_checkpointing: bool = False  # recompute block activations in the backward pass (memory; same gradients)
    hyper_streams: int = 1  # residual streams (hyper-connections, nn.hyper); 1 = off, the plain stream
    hyper_variant: HyperVariant = "hc"  # hc (Zhu et al.) | mhc (Sinkhorn-constrained stream mixing, Xie et al.)

    def validate(self) -> None:
        check_diffusion_config(self, "sit")
        check_shortcut(self.shortcut, self.decay_branches)
        check_branch_settings(self)
        check_hyper(self.hyper_streams, self.hyper_variant, self.shortcut, self.drop_identity)
        if self.embed_dim % 4:
            raise ConfigError(f"model.embed_dim {self.embed_dim} must be divisible by 4 (2-D sin-cos positions)")
        if self.skips and (self.depth < 2 or self.depth % 2):
            raise ConfigError(f"model.depth {self.depth} must be even and >= 2 when model.skips is on "
                              "(the network splits into two mirrored halves); or set model.skips=false")


@register_family("sit", config=SiTConfig, objective=diffusion_objective, diffusion=True, example_batch=diffusion_batch,
                 tiny=dict(img_size=8, in_chans=4, patch_size=2, embed_dim=32, depth=4, num_heads=2, num_classes=10,
                           alpha_min=0.8))
class SiT(GradCheckpointing, nn.Module):
    def __init__(self, cfg: SiTConfig):
        super().__init__()
        diffusion_stem(self, cfg)  # cfg, patch_embed, t_embedder, y_embedder
        D, N = cfg.embed_dim, self.patch_embed.num_patches
        self.num_prefix_tokens = 0  # SiT has patch tokens only
        self.pos_embed = nn.Parameter(torch.zeros(1, N, D), requires_grad=False)  # fixed sin-cos (DiT)
        plan = shortcut_plan(cfg.depth, cfg.alpha_min, cfg.schedule, cfg.decay_branches, cfg.shortcut)
        self.alphas = plan.alphas  # (depth, 2) over ALL blocks
        self.num_blocks = cfg.depth
        branch = branch_block_kwargs(cfg, cfg.depth)  # gains and drops (nn.branch_scale)
        self.blocks = nn.ModuleList(AdaLNBlock(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, gelu=cfg.gelu, **factors, **b)
                                    for factors, b in zip(plan.block_kwargs(), branch, strict=True))
        self.hyper = hyper_streams(cfg, self.blocks, N)  # None: one residual stream
        # Long skips (paper-notes §3): decoder block j (second half) adds Linear(D->D) of the output
        # of encoder block depth/2-1-j to its input, U-Net style (deepest encoder block first).
        self.half = cfg.depth // 2
        self.skip_linears = nn.ModuleList(nn.Linear(D, D) for _ in range(self.half if cfg.skips else 0))
        self.final_layer = FinalLayer(D, cfg.patch_size, cfg.in_chans)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        cfg = self.cfg
        # 1. DiT's base: every Linear xavier-uniform with zero bias; patch projection like a Linear;
        #    fixed 2-D sin-cos positions (no cls slot); label table and timestep MLP ~ N(0, 0.02).
        #    The long-skip Linears keep these xavier weights and zero biases, as the authors' SiT.
        self.apply(lambda m: init_linear_xavier(m) if isinstance(m, nn.Linear) else None)
        init_patch_embed(self.patch_embed)
        self.pos_embed.data.copy_(sincos_pos_embed_2d(cfg.embed_dim, self.patch_embed.grid, cls_token=False).unsqueeze(0))
        if self.y_embedder is not None:
            nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        # 2. adaLN-Zero (part of the architecture, always on): the modulation Linears start at zero,
        #    so every gate is 0 and each block starts as x -> alpha_attn*alpha_mlp*x; the final
        #    layer starts at zero too, so the first prediction is exactly 0.
        for mod in (*(blk.adaLN_modulation[-1] for blk in self.blocks), self.final_layer.adaLN_modulation[-1],
                    self.final_layer.linear):
            nn.init.zeros_(mod.weight)
            nn.init.zeros_(mod.bias)
        # A gain that starts at 0 (model.branch_scale rezero / skipinit) is the blocks' zero start instead:
        # its gates start at 1, since a zero gate times a zero gain gives neither a gradient (nn.branch_scale).
        if starts_silent(self.blocks[0]):
            for blk in self.blocks:
                blk.open_gates()
        # 3. zero_init (an option, not the authors' default): the skip Linears start silent, so the
        #    skips join the network gradually and cannot carry a shortcut around the decay at init.
        if cfg.zero_init:
            for lin in self.skip_linears:
                nn.init.zeros_(lin.weight)

    def condition(self, t: torch.Tensor, y: torch.Tensor | None, batch: int,
                  force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:  # -> c (B, D)
        c = self.t_embedder(t)
        cy = embed_labels(self.y_embedder, y, batch, t.device, self.training, force_drop_ids)
        return c if cy is None else c + cy

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None,
                force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, H, W) noisy input, (B,) timesteps, (B,) labels -> (B, C, H, W) prediction."""
        x = self.patch_embed(x) + self.pos_embed  # (B, N, D)
        c = self.condition(t, y, x.shape[0], force_drop_ids)  # (B, D)
        skips, x = [], expand_streams(self.hyper, x)
        for i, blk in enumerate(self.blocks):
            x = self.block(i, blk, x, c, skips)
        return unpatchify(self.final_layer(reduce_streams(self.hyper, x), c), self.cfg.patch_size, self.cfg.in_chans)

    def block(self, i: int, blk: AdaLNBlock, x: torch.Tensor, c: torch.Tensor, skips: list) -> torch.Tensor:
        """Run block i with its long skip: decoder block j (second half) adds Linear(D->D) of the
        deepest remaining encoder output to its input; encoder blocks push theirs. With hyper-connections x is
        the streams: a skip source is their sum, and its Linear enters every stream as the input did (expand)."""
        if self.cfg.skips and i >= self.half:
            x = x + expand_streams(self.hyper, self.skip_linears[i - self.half](skips.pop()))
        x = run_block(self.hyper, i, blk, x, c)
        if self.cfg.skips and i < self.half:
            skips.append(reduce_streams(self.hyper, x))
        return x

    def forward_intermediates(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None,
                              indices: list[int] | None = None) -> list[torch.Tensor]:
        """Outputs (B, N, D) of the requested blocks (0-indexed over the whole network)."""
        wanted = resolve_blocks(indices, self.num_blocks)
        x = self.patch_embed(x) + self.pos_embed
        c = self.condition(t, y, x.shape[0])
        skips, out, x = [], {}, expand_streams(self.hyper, x)
        for i, blk in enumerate(self.blocks[: max(wanted) + 1]):
            x = self.block(i, blk, x, c, skips)
            out[i] = reduce_streams(self.hyper, x)
        return [out[i] for i in wanted]

    @property
    def decoder_blocks(self) -> nn.ModuleList:
        """SiT has no separate decoder (the model contract's empty list): its blocks are one list."""
        return nn.ModuleList()

    def forward_features(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """The last block's output tokens, raw: what evaluation pools (the model contract's features)."""
        return self.forward_intermediates(x, t, y)[0]

    def flops_per_sample(self) -> float:
        """Analytic forward matmul FLOPs of one sample (2 per multiply-add), as MAE's."""
        cfg, N = self.cfg, self.patch_embed.num_patches
        D, r, out = cfg.embed_dim, cfg.mlp_ratio, cfg.patch_size**2 * cfg.in_chans
        block = block_flops(N, D, r) + 2 * D * 6 * D  # + adaLN modulation
        f = 2 * N * out * D  # patch embedding
        f += 2 * (self.t_embedder.freq_dim * D + D * D)  # timestep MLP
        f += cfg.depth * block + len(self.skip_linears) * 2 * N * D * D
        f += 2 * D * 2 * D + 2 * N * D * out  # final adaLN + linear
        f += 0.0 if self.hyper is None else self.hyper.flops_per_sample()  # the streams' mixing (nn.hyper)
        return float(f)


__all__ = ["SiT", "SiTConfig"]
