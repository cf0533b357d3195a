"""The ViT encoder with decayed shortcuts, shared by the MAE and by classifiers built from a
pretrained MAE (fine-tuning, linear probing). Parameter names are MAE's (``patch_embed``,
``cls_token``, ``pos_embed``, ``blocks``, ``norm``), so encoder weights move between them and
from facebookresearch/mae checkpoints key for key."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..nn.blocks import Block, PatchEmbed, block_flops
from ..nn.branch_scale import branch_block_kwargs, depth_rates
from ..nn.hyper import expand_streams, hyper_streams, reduce_streams, run_block
from ..nn.residual import shortcut_plan
from ..schedule import effective_decay
from .common import GradCheckpointing, resolve_blocks


class ViTEncoder(GradCheckpointing, nn.Module):
    """Patch embedding, learned cls token, fixed 2-D sin-cos positions and ``depth`` pre-LN blocks
    whose residual adds follow the shortcut formula ``cfg.shortcut`` (``resdecay.nn.residual``; the
    default ``decay`` is ``alpha_schedule(depth, alpha_min, schedule)``) on ``cfg.decay_branches``.

    ``cfg`` needs img_size, in_chans, patch_size, embed_dim, depth, num_heads, mlp_ratio,
    alpha_min, schedule and encoder_norm (an ``MAEConfig`` has them all); its branch gains and drops
    (``branch_scale``, ``drop_branch``, ``drop_identity``: ``nn.branch_scale``) where it has them. With
    ``cfg.hyper_streams`` > 1 the blocks run on that many residual streams (``nn.hyper``, ``self.hyper``); every
    block output read here is the streams' sum.

    ``drop_path``: a classifier's own stochastic depth (fine-tuning's ``model.drop_path``, on the branches),
    which replaces the pretraining config's drops; None: the config's. ``tokens``: the tokens a block sees per
    sample, for the FLOPs estimate (default: an MAE's visible ones)."""

    def __init__(self, cfg, drop_path: float | None = None, tokens: int | None = None):
        super().__init__()
        self.cfg = cfg
        D = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + 1, D), requires_grad=False)
        plan = shortcut_plan(cfg.depth, cfg.alpha_min, cfg.schedule, cfg.decay_branches, cfg.shortcut)
        self.alphas = plan.alphas  # (depth, 2): attention, MLP
        branch = branch_block_kwargs(cfg, cfg.depth)  # gains, and drops growing with depth (timm)
        if drop_path is not None:  # the gains are weights and stay; pretraining's drops give way to fine-tuning's
            rates = depth_rates(drop_path, cfg.depth)
            branch = [dict(b, drop_path=r, drop_identity=0.0) for b, r in zip(branch, rates, strict=True)]
        self.blocks = nn.ModuleList(Block(D, cfg.num_heads, cfg.mlp_ratio, **factors, **b)
                                    for factors, b in zip(plan.block_kwargs(), branch, strict=True))
        if tokens is None:
            tokens = 1 + int(self.patch_embed.num_patches * (1 - getattr(cfg, "mask_ratio", 0.0)))
        self.hyper = hyper_streams(cfg, self.blocks, tokens)  # None: one residual stream
        # U-Net MAE: no final norm, the bottleneck is the raw last block (paper-notes §2).
        self.norm = nn.LayerNorm(D, eps=1e-6) if cfg.encoder_norm else nn.Identity()

    @property
    def alpha_eff(self) -> float:
        return effective_decay(self.alphas)

    @property
    def num_blocks(self) -> int:
        """Encoder blocks: what ``forward_intermediates`` indices count."""
        return len(self.blocks)

    def cls_with_pos(self, batch: int) -> torch.Tensor:  # (B, 1, D)
        return (self.cls_token + self.pos_embed[:, :1]).expand(batch, -1, -1)

    def embed(self, imgs: torch.Tensor) -> torch.Tensor:
        """All tokens with positions, cls first: (B, C, H, W) -> (B, 1+N, D)."""
        x = self.patch_embed(imgs) + self.pos_embed[:, 1:]
        return torch.cat([self.cls_with_pos(x.shape[0]), x], dim=1)

    def forward_intermediates(self, imgs: torch.Tensor, indices: list[int] | None = None) -> list[torch.Tensor]:
        """Unmasked encoder block outputs (B, 1+N, D) in image order, raw (no norm), for the
        requested 0-indexed blocks (negative counts from the end; default: the last)."""
        wanted = resolve_blocks(indices, len(self.blocks))
        x = expand_streams(self.hyper, self.embed(imgs))
        out = {}
        for i, blk in enumerate(self.blocks[: max(wanted) + 1]):
            x = run_block(self.hyper, i, blk, x)
            out[i] = reduce_streams(self.hyper, x)
        return [out[i] for i in wanted]

    def forward_features(self, imgs: torch.Tensor, layer: int = -1) -> torch.Tensor:
        """Unmasked tokens (B, 1+N, D) of encoder block ``layer`` (default: the last), raw: what
        evaluation pools (the model contract's features)."""
        return self.forward_intermediates(imgs, [layer])[0]

    def encoder_flops(self, tokens: int) -> float:
        """Forward matmul FLOPs of the blocks on ``tokens`` tokens (2 per multiply-add), hyper-connections included."""
        hyper = 0.0 if self.hyper is None else self.hyper.flops_per_sample(tokens)
        return self.cfg.depth * block_flops(tokens, self.cfg.embed_dim, self.cfg.mlp_ratio) + hyper
