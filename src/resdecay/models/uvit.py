"""U-ViT (Bao et al., 2023): a ViT diffusion backbone that treats everything as tokens (time,
label, image patches) and joins shallow and deep blocks with concatenating long skips; here with
decayed identity shortcuts (paper Table 4, paper-notes §3: "replacing only the residual connections").

    U-ViT without skips   alpha_min=1,  skips=False
    U-ViT                 alpha_min=1,  skips=True
    decayed U-ViT         alpha_min<1,  skips=True   (Table 4: 0.8 / 0.7 / 0.6)

Layout of the ``depth`` (odd) blocks, held in one ``blocks`` list in network order:
in blocks 0..n-1, the mid block n, out blocks n+1..2n, with n = (depth-1)//2. Before out block j
runs, its input is concatenated with the output of the mirrored in block n-1-j and mapped back by
Linear(2D -> D) (U-ViT's ``skip_linear``). Block i uses row i of the shortcut formula's factors
(``model.shortcut``; the default decay is ``alpha_schedule(depth, alpha_min)[i]``): the decay runs
through all blocks and ends at the last out block (paper-notes §1).

Shapes: images (B, C, H, W); N = (H/p)^2 patches; tokens (B, E+N, D) with E = 1 (time) or 2
(time, label) prefix tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from ..diffusion.objectives import NoiseSchedule, Objective
from ..errors import ConfigError
from ..nn.blocks import Block, block_flops, init_linear_xavier, init_patch_embed, unpatchify
from ..nn.branch_scale import BranchScale, branch_block_kwargs, check_branch_settings
from ..nn.conditioning import embed_labels
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
class UViTConfig(ModelConfig):
    family: str = "uvit"
    img_size: int = 32  # square input side (pixels, or latents for the -m2 preset)
    in_chans: int = 3
    patch_size: int = 2
    embed_dim: int = 512  # U-ViT-S: 512 x 13 / 8 heads; U-ViT-M: 768 x 17 / 12 heads
    depth: int = 13  # total blocks, odd: (depth-1)/2 in, 1 mid, (depth-1)/2 out
    num_heads: int = 8
    mlp_ratio: float = 4.0
    qkv_bias: bool = False  # as U-ViT
    num_classes: int = 0  # 0 = unconditional; otherwise label num_classes is the null label (CFG)
    class_dropout: float = 0.1  # training-time probability of replacing a label with the null label
    alpha_min: float = 1.0  # shortcut factor of the last sub-block; 1 = plain residual
    schedule: Schedule = "linear"  # see resdecay.schedule
    shortcut: str = "decay"  # a registered formula (resdecay.nn.residual): decay | learnable | scaled_sum | scaled_branch
    decay_branches: Branches = "both"  # both | attn | mlp: which sub-blocks the formula applies to (Table 3b)
    branch_scale: BranchScale = "none"  # none | rezero | layerscale | skipinit: a gain on every branch (nn.branch_scale)
    layerscale_init: float = 1e-5  # LayerScale's initial gain epsilon (CaiT: 1e-5 deep, 0.1 shallow)
    drop_branch: float = 0.0  # stochastic depth on the branch (DropPath): the last block's rate, linear in depth
    drop_identity: float = 0.0  # stochastic depth on the shortcut instead: the last block's rate, linear in depth
    skips: bool = True  # U-ViT's concatenating long skips
    zero_init: bool = True  # zero each block's branch output layer (attn proj, MLP fc2)
    objective: Objective = "ddpm-eps"  # stored for the loss/sampler module: ddpm-eps (U-ViT's) | interp-v
    noise_schedule: NoiseSchedule = "linear"  # stored only: linear | cosine
    grad_checkpointing: bool = False  # recompute block activations in the backward pass (memory; same gradients)
    hyper_streams: int = 1  # residual streams (hyper-connections, nn.hyper); 1 = off, the plain stream
    hyper_variant: HyperVariant = "hc"  # hc (Zhu et al.) | mhc (Sinkhorn-constrained stream mixing, Xie et al.)

    def validate(self) -> None:
        check_diffusion_config(self, "uvit")
        check_shortcut(self.shortcut, self.decay_branches)
        check_branch_settings(self)
        check_hyper(self.hyper_streams, self.hyper_variant, self.shortcut, self.drop_identity)
        if self.depth < 3 or self.depth % 2 == 0:
            raise ConfigError(f"model.depth {self.depth} must be odd and >= 3 for U-ViT "
                              "((depth-1)/2 in blocks, 1 mid block, (depth-1)/2 out blocks), e.g. 7, 13, 17")


@register_family("uvit", config=UViTConfig, objective=diffusion_objective, diffusion=True, example_batch=diffusion_batch,
                 tiny=dict(img_size=8, patch_size=2, embed_dim=32, depth=5, num_heads=2, num_classes=10, alpha_min=0.7))
class UViT(GradCheckpointing, nn.Module):
    def __init__(self, cfg: UViTConfig):
        super().__init__()
        # Time enters as a token (U-ViT), from DiT's sinusoid -> MLP embedder (U-ViT's
        # mlp_time_embed option) so that DDPM steps and interpolant times in [0, 1] both work.
        diffusion_stem(self, cfg)  # cfg, patch_embed, t_embedder, y_embedder
        D, N = cfg.embed_dim, self.patch_embed.num_patches
        self.num_prefix_tokens = 1 + (self.y_embedder is not None)  # [time, (label)] before the patches
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + N, D))  # learned (U-ViT)
        plan = shortcut_plan(cfg.depth, cfg.alpha_min, cfg.schedule, cfg.decay_branches, cfg.shortcut)
        self.alphas = plan.alphas  # (depth, 2) over ALL blocks
        self.num_blocks = cfg.depth
        branch = branch_block_kwargs(cfg, cfg.depth)  # gains and drops (nn.branch_scale)
        self.blocks = nn.ModuleList(Block(D, cfg.num_heads, cfg.mlp_ratio, qkv_bias=cfg.qkv_bias, **factors, **b)
                                    for factors, b in zip(plan.block_kwargs(), branch, strict=True))
        self.num_in = (cfg.depth - 1) // 2  # in blocks; the mid block is blocks[num_in]
        self.skip_linears = nn.ModuleList(nn.Linear(2 * D, D) for _ in range(self.num_in if cfg.skips else 0))
        T = self.num_prefix_tokens + N
        # None: one residual stream; with n streams each skip Linear runs once per stream (see ``block``)
        self.hyper = hyper_streams(cfg, self.blocks, T, per_stream_flops=len(self.skip_linears) * 2 * T * 2 * D * D)
        self.norm = nn.LayerNorm(D)
        self.decoder_pred = nn.Linear(D, cfg.patch_size**2 * cfg.in_chans)
        self.final_layer = nn.Conv2d(cfg.in_chans, cfg.in_chans, 3, padding=1)  # U-ViT's final 3x3 conv
        self.initialize_weights()

    def initialize_weights(self) -> None:
        # 1. Every Linear xavier-uniform with zero bias (skip Linears and time MLP included), LayerNorms
        #    unit; patch projection like a Linear; learned positions and label table ~ N(0, 0.02) as
        #    U-ViT; the final conv keeps PyTorch's default init, as U-ViT.
        self.apply(init_linear_xavier)
        init_patch_embed(self.patch_embed)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.y_embedder is not None:
            nn.init.normal_(self.y_embedder.embedding_table.weight, std=0.02)
        # 2. zero_init (paper §3, paper-notes §1): each block's branch output layers start at zero,
        #    so block i starts as x -> alpha_attn_i * alpha_mlp_i * x and the branches cannot outgrow
        #    the decayed shortcut early. The skip Linears stay xavier: they are not residual branches,
        #    their output *is* the out block's input, so zeroing them would cut the stream.
        if self.cfg.zero_init:
            for blk in self.blocks:
                blk.zero_init_branches()

    def embed(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None,
              force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, H, W), (B,), (B,) -> tokens (B, E+N, D): [time, (label), patches] + positions."""
        patches = self.patch_embed(x)  # (B, N, D)
        prefix = [self.t_embedder(t).unsqueeze(1)]  # (B, 1, D)
        label = embed_labels(self.y_embedder, y, x.shape[0], x.device, self.training, force_drop_ids)
        if label is not None:
            prefix.append(label.unsqueeze(1))
        return torch.cat([*prefix, patches], dim=1) + self.pos_embed

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None,
                force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, H, W) noisy input, (B,) timesteps, (B,) labels -> (B, C, H, W) prediction."""
        x = expand_streams(self.hyper, self.embed(x, t, y, force_drop_ids))  # (B, E+N, D); ((B n), E+N, D) with streams
        skips = []
        for i, blk in enumerate(self.blocks):
            x = self.block(i, blk, x, skips)
        pred = self.decoder_pred(self.norm(reduce_streams(self.hyper, x))[:, self.num_prefix_tokens:])  # (B, N, p*p*C); prefix dropped
        return self.final_layer(unpatchify(pred, self.cfg.patch_size, self.cfg.in_chans))

    def block(self, i: int, blk: Block, x: torch.Tensor, skips: list) -> torch.Tensor:
        """Run block i with U-ViT's long skip: out block j = i - num_in - 1 first concatenates the
        output of in block num_in-1-j and maps it back with Linear(2D -> D); in blocks push theirs. With
        hyper-connections x is the streams: a skip source is their sum, joined to every stream, and the Linear maps
        each stream on its own, so the streams stay distinct through the skips."""
        if self.cfg.skips and i > self.num_in:
            skip = expand_streams(self.hyper, skips.pop())
            x = self.skip_linears[i - self.num_in - 1](torch.cat([x, skip], dim=-1))
        x = run_block(self.hyper, i, blk, x)
        if self.cfg.skips and i < self.num_in:
            skips.append(reduce_streams(self.hyper, x))
        return x

    def forward_intermediates(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None,
                              indices: list[int] | None = None) -> list[torch.Tensor]:
        """Outputs (B, E+N, D) of the requested blocks (0-indexed in network order: in, mid, out),
        prefix tokens included (``num_prefix_tokens`` of them, first)."""
        wanted = resolve_blocks(indices, self.num_blocks)
        x = expand_streams(self.hyper, self.embed(x, t, y))
        skips, out = [], {}
        for i, blk in enumerate(self.blocks[: max(wanted) + 1]):
            x = self.block(i, blk, x, skips)
            out[i] = reduce_streams(self.hyper, x)
        return [out[i] for i in wanted]

    @property
    def decoder_blocks(self) -> nn.ModuleList:
        """UViT has no separate decoder (the model contract's empty list): its blocks are one list."""
        return nn.ModuleList()

    def forward_features(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """The last block's output tokens, raw: what evaluation pools (the model contract's features)."""
        return self.forward_intermediates(x, t, y)[0]

    def flops_per_sample(self) -> float:
        """Analytic forward matmul FLOPs of one sample (2 per multiply-add), as MAE's."""
        cfg, N = self.cfg, self.patch_embed.num_patches
        D, r, C, p = cfg.embed_dim, cfg.mlp_ratio, cfg.in_chans, cfg.patch_size
        T = self.num_prefix_tokens + N
        f = 2 * N * C * p * p * D  # patch embedding
        f += 2 * (self.t_embedder.freq_dim * D + D * D)  # timestep MLP (one token)
        f += cfg.depth * block_flops(T, D, r)
        f += len(self.skip_linears) * 2 * T * 2 * D * D
        f += 2 * N * D * p * p * C  # decoder_pred on the patch tokens
        f += 2 * cfg.img_size**2 * C * C * 9  # final 3x3 conv
        f += 0.0 if self.hyper is None else self.hyper.flops_per_sample()  # the streams' mixing (nn.hyper)
        return float(f)


__all__ = ["UViT", "UViTConfig"]
