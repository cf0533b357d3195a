"""Masked autoencoders: the plain MAE (He et al., 2022) and the decayed U-Net MAE of
Zhang et al. (paper Fig. 5, paper-notes §2), one family with switches.

    plain MAE   alpha_min=1, skips=False, zero_init=False, encoder_norm=True
    U-Net MAE   alpha_min<1, skips=True,  zero_init=True,  encoder_norm=False

Conventions (as facebookresearch/mae): images (B, C, H, W); N = (H/p)^2 patches; K = kept
patches; token 0 is cls; in ``mask`` 0 is keep and 1 is remove; ``ids_restore`` undoes the
per-sample shuffle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import check_fields
from ..nn.blocks import (
    Block,
    block_flops,
    init_linear_xavier,
    init_patch_embed,
    patchify,
    sincos_pos_embed_2d,
    unpatchify,
)
from ..nn.branch_scale import BranchScale, branch_block_kwargs, check_branch_settings
from ..nn.hyper import HyperVariant, check_hyper, expand_streams, reduce_streams, run_block
from ..nn.noise import draw
from ..nn.residual import check_shortcut, shortcut_plan
from ..schedule import Branches, Schedule, check_alpha_min
from .common import check_patch_size
from .contract import ModelConfig
from .encoder import ViTEncoder
from .registry import register_family


@dataclass
class MAEConfig(ModelConfig):
    family: str = "mae"
    img_size: int = 224  # square input side; must be divisible by patch_size
    in_chans: int = 3
    patch_size: int = 16
    embed_dim: int = 768  # encoder width
    depth: int = 12  # encoder blocks; the decay runs over these only (decoder is plain)
    num_heads: int = 12
    mlp_ratio: float = 4.0
    decoder_embed_dim: int = 512
    decoder_depth: int = 8
    decoder_num_heads: int = 16
    alpha_min: float = 0.6  # shortcut factor of the last encoder sub-block; 1 = plain residual
    schedule: Schedule = "linear"  # see resdecay.schedule: linear | paper | cosine | constant
    shortcut: str = "decay"  # a registered formula: decay | learnable | scaled_sum (sqrt(.5)(x+f)) | scaled_branch (x+sqrt(.5)f)
    decay_branches: Branches = "both"  # both | attn | mlp: which sub-blocks the formula applies to (Table 3b)
    decoder_decay: bool = False  # the decoder follows shortcut/decay_branches too (own schedule to alpha_min); off: plain x + f
    # branch gains and stochastic depth (nn.branch_scale), on the encoder (and the decoder with decoder_decay):
    branch_scale: BranchScale = "none"  # none | rezero | layerscale | skipinit: a learned gain on every branch
    layerscale_init: float = 1e-5  # LayerScale's initial gain epsilon (CaiT: 1e-5 deep, 0.1 shallow)
    drop_branch: float = 0.0  # stochastic depth on the branch (DropPath): the last block's rate, linear in depth
    drop_identity: float = 0.0  # stochastic depth on the shortcut instead: the last block's rate, linear in depth
    skips: bool = True  # encoder->decoder long skips (U-Net MAE); False = standard MAE decoder
    skip_sources: list[int] | None = None  # explicit encoder blocks for the skips (0-indexed)
    zero_init: bool = True  # zero the last layer of every branch, fusion and the pixel head
    encoder_norm: bool = False  # final LayerNorm on the encoder (standard MAE has one)
    mask_ratio: float = 0.75
    norm_pix_loss: bool = True  # per-patch normalised pixel targets (MAE's best setting)
    grad_checkpointing: bool = False  # recompute block activations in the backward pass (memory; same gradients)
    hyper_streams: int = 1  # residual streams of the encoder blocks (hyper-connections, nn.hyper); 1 = off, the plain stream
    hyper_variant: HyperVariant = "hc"  # hc (Zhu et al.) | mhc (Sinkhorn-constrained stream mixing, Xie et al.)

    @property
    def token_grid(self) -> tuple[int, int]:
        return (self.img_size // self.patch_size,) * 2

    def validate(self) -> None:
        check_fields(self, "model", positive=("depth", "decoder_depth", "embed_dim", "decoder_embed_dim", "patch_size", "img_size"))
        check_alpha_min(self.alpha_min)
        check_shortcut(self.shortcut, self.decay_branches)
        check_branch_settings(self)
        check_hyper(self.hyper_streams, self.hyper_variant, self.shortcut, self.drop_identity)
        check_patch_size(self.img_size, self.patch_size, " or resize the images")
        if not 0.0 <= self.mask_ratio < 1.0:
            raise ValueError(f"model.mask_ratio must lie in [0, 1), got {self.mask_ratio}")
        n = (self.img_size // self.patch_size) ** 2
        keep = int(n * (1 - self.mask_ratio))  # as random_masking counts them
        if keep < 1 or keep >= n:  # nothing for the encoder to see, or nothing to reconstruct (loss 0/0)
            hi = math.floor((1 - 1 / n) * 1e4) / 1e4  # rounded down so that it still keeps one patch
            raise ValueError(f"model.mask_ratio {self.mask_ratio} leaves {keep} of {n} patches visible; the MAE needs at "
                             f"least one visible and one masked patch: use a ratio above 0 and at most {hi:g}")
        for dim, heads, what in ((self.embed_dim, self.num_heads, ""), (self.decoder_embed_dim, self.decoder_num_heads, "decoder_")):
            if dim % heads or dim % 4:
                raise ValueError(f"model.{what}embed_dim {dim} must be divisible by 4 and by model.{what}num_heads {heads}")
        if self.skips:
            choose_skip_sources(self.depth, self.decoder_depth, self.skip_sources)

    def warnings(self) -> list[str]:
        """A U-Net MAE whose decoder is too shallow to take a long skip from most encoder blocks."""
        sources = choose_skip_sources(self.depth, self.decoder_depth, self.skip_sources) if self.skips else []
        if not sources or 4 * len(sources) >= self.depth:
            return []
        return [f"warning: only {len(sources)} of {self.depth} encoder blocks feed the decoder (model.decoder_depth="
                f"{self.decoder_depth} long skips); raise model.decoder_depth to about {math.ceil(self.depth / 2)} "
                "or set model.skip_sources"]


# The smallest MAE: what the contract tests build (and the classifier's tiny encoder).
TINY_MAE = dict(img_size=16, in_chans=3, patch_size=4, embed_dim=32, depth=4, num_heads=2, decoder_embed_dim=32,
                decoder_depth=2, decoder_num_heads=2)


def choose_skip_sources(depth: int, decoder_depth: int, override: list[int] | None = None) -> list[int]:
    """Encoder blocks whose outputs feed the decoder, deepest first (fusion j gets entry j).

    The authors push every other block, ending with the last (1, 3, ..., 11 for L = 12), and
    decoder block j pops the deepest remaining one; decoder blocks past the last skip get none.
    That needs ceil(L/2) <= decoder_depth. For deeper encoders (ViT-L: 12 skips, 8 decoder
    blocks; the authors' code then leaves fusion layers unused and DDP fails) we widen the
    stride to s = ceil(L / decoder_depth) so that the sources still span the whole encoder and
    the deepest block (the bottleneck) is always the first: L-1, L-1-s, ... For L = 24 and 8
    decoder blocks: 23, 20, 17, 14, 11, 8, 5, 2. L = 12 and 8 gives the authors' 11, 9, ..., 1.
    """
    if override is not None:
        src = sorted({int(i) for i in override}, reverse=True)
        if not src or src[0] >= depth or src[-1] < 0 or len(src) > decoder_depth or len(src) != len(override):
            raise ValueError(
                f"model.skip_sources {override} must be distinct encoder block indices in [0, {depth - 1}], "
                f"at most decoder_depth={decoder_depth} of them"
            )
        return src
    stride = max(2, math.ceil(depth / decoder_depth))
    return list(range(depth - 1, -1, -stride))[:decoder_depth]


def fill_and_unshuffle(x: torch.Tensor, ids_restore: torch.Tensor, mask_token: torch.Tensor) -> torch.Tensor:
    """(B, 1+K, D) visible tokens -> (B, 1+N, D) in image order, mask_token at removed places."""
    B, T, D = x.shape
    N = ids_restore.shape[1]
    patches = torch.cat([x[:, 1:], mask_token.to(x.dtype).expand(B, N + 1 - T, D)], dim=1)  # (B, N, D) shuffled
    patches = torch.gather(patches, 1, ids_restore.unsqueeze(-1).expand(B, N, D))
    return torch.cat([x[:, :1], patches], dim=1)


class SkipFusion(nn.Module):
    """One encoder->decoder long skip (paper Fig. 5): the encoder block's visible tokens get this
    skip's own mask token (encoder width) at the removed places, are put back in image order,
    concatenated with the decoder stream (encoder first) and added through Linear-SiLU-Linear.
    The last Linear starts at zero, so a new skip starts silent.

    Computed without the concatenation, which costs time and memory: ``fc1(cat[E, dec]) = E W_e^T + dec W_d^T + b``
    and a Linear commutes with fill-and-unshuffle, so the encoder half of ``fc1`` runs on the
    1+K visible tokens only, the removed places get the constant ``mask_token W_e^T``, and the
    unshuffle moves decoder-width rows in the compute dtype. Same parameters, same state_dict, the
    same function up to float rounding (tests/models/test_mae.py keeps the concatenating form as reference)."""

    def __init__(self, enc_dim: int, dec_dim: int):
        super().__init__()
        self.mask_token = nn.Parameter(torch.zeros(1, 1, enc_dim))
        self.fc1 = nn.Linear(enc_dim + dec_dim, dec_dim)
        self.act = nn.SiLU()
        self.fc2 = nn.Linear(dec_dim, dec_dim)

    def forward(self, dec: torch.Tensor, enc: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        w_enc, w_dec = self.fc1.weight.split([enc.shape[-1], dec.shape[-1]], dim=1)
        e = fill_and_unshuffle(F.linear(enc, w_enc), ids_restore, F.linear(self.mask_token, w_enc))  # (B, 1+N, Dd)
        return dec + self.fc2(self.act(F.linear(dec, w_dec, self.fc1.bias) + e))  # (B, 1+N, Dd)


def mae_objective(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """MAE pretraining loss: norm-pix MSE on the removed patches (labels unused)."""
    return model(images)[0]


@register_family("mae", config=MAEConfig, objective=mae_objective, tiny=TINY_MAE)
class MaskedAutoencoder(ViTEncoder):
    def __init__(self, cfg: MAEConfig):
        cfg.validate()
        super().__init__(cfg)  # patch_embed, cls_token, pos_embed, decayed blocks, norm
        D, Dd, p = cfg.embed_dim, cfg.decoder_embed_dim, cfg.patch_size
        N = self.patch_embed.num_patches

        # --------------------------------------------------------------- decoder
        self.skip_sources = choose_skip_sources(cfg.depth, cfg.decoder_depth, cfg.skip_sources) if cfg.skips else []
        if cfg.skips:
            # The decoder stream starts content-free (own cls + positions); the image enters
            # only through the skips, the bottleneck through the first one.
            self.decoder_cls_token = nn.Parameter(torch.zeros(1, 1, Dd))
            self.decoder_embed = nn.Linear(Dd, Dd)
            self.skip_fusions = nn.ModuleList(SkipFusion(D, Dd) for _ in self.skip_sources)
        else:
            # Standard MAE: project the encoder output, fill removed places with one mask token.
            self.decoder_embed = nn.Linear(D, Dd)
            self.mask_token = nn.Parameter(torch.zeros(1, 1, Dd))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, N + 1, Dd), requires_grad=False)
        # The decoder is MAE's plain x + f(x) (the paper decays the encoder only) unless decoder_decay:
        # then the formula, the branch gains and the drops apply to it as to the encoder, on its own depth.
        dec = (shortcut_plan(cfg.decoder_depth, cfg.alpha_min, cfg.schedule, cfg.decay_branches, cfg.shortcut)
               if cfg.decoder_decay else shortcut_plan(cfg.decoder_depth, 1.0, cfg.schedule))
        branch = branch_block_kwargs(cfg, cfg.decoder_depth, enabled=cfg.decoder_decay)
        self.decoder_blocks = nn.ModuleList(Block(Dd, cfg.decoder_num_heads, cfg.mlp_ratio, **factors, **b)
                                            for factors, b in zip(dec.block_kwargs(), branch, strict=True))
        self.decoder_norm = nn.LayerNorm(Dd, eps=1e-6)
        self.decoder_pred = nn.Linear(Dd, p * p * cfg.in_chans)
        self.initialize_weights()

    def initialize_weights(self) -> None:
        cfg, grid = self.cfg, self.patch_embed.grid
        # 1. Fixed 2-D sin-cos position tables (cls slot zero), never trained.
        self.pos_embed.data.copy_(sincos_pos_embed_2d(cfg.embed_dim, grid).unsqueeze(0))
        self.decoder_pos_embed.data.copy_(sincos_pos_embed_2d(cfg.decoder_embed_dim, grid).unsqueeze(0))
        # 2. Every Linear xavier-uniform with zero bias, LayerNorms unit; patch projection like a
        #    Linear, its bias left at PyTorch's default uniform init (facebookresearch/mae does so).
        self.apply(init_linear_xavier)
        init_patch_embed(self.patch_embed, zero_bias=False)
        # 3. Learned tokens ~ N(0, 0.02), as MAE.
        for name, param in self.named_parameters():
            if name.endswith(("cls_token", "mask_token")):
                nn.init.normal_(param, std=0.02)
        if not cfg.zero_init:
            return
        # 4. Zero-init (paper §3): the last layer of every attention/MLP branch, encoder and
        #    decoder, so each block starts as x -> alpha_attn*alpha_mlp*x and the decay cannot be
        #    fought by growing branch norms; the last Linear of each skip fusion, so skips start
        #    silent; and the pixel head, so the first loss is the targets' variance.
        for blk in (*self.blocks, *self.decoder_blocks):
            blk.zero_init_branches()
        for fusion in getattr(self, "skip_fusions", []):
            nn.init.zeros_(fusion.fc2.weight)
        nn.init.zeros_(self.decoder_pred.weight)

    # ------------------------------------------------------------------ helpers
    def patchify(self, imgs: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, N, p*p*C), patches in row-major order, pixels (p, q, c)."""
        return patchify(imgs, self.cfg.patch_size)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, p*p*C) -> (B, C, H, W)."""
        return unpatchify(x, self.cfg.patch_size, self.cfg.in_chans)

    def random_masking(self, x: torch.Tensor, mask_ratio: float):
        """Keep a random subset of int(N*(1-mask_ratio)) patches per sample (argsort of noise).

        x: (B, N, D) -> kept (B, K, D), mask (B, N) with 0 keep / 1 remove, ids_restore (B, N).
        """
        B, N, D = x.shape
        keep = int(N * (1 - mask_ratio))
        noise = draw(lambda n: torch.rand(n, N, device=x.device), B)  # per rank, or the effective batch's (nn/noise.py)
        ids_shuffle = torch.argsort(noise, dim=1)  # ascending: small noise is kept
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        kept = torch.gather(x, 1, ids_shuffle[:, :keep].unsqueeze(-1).expand(B, keep, D))
        mask = torch.ones(B, N, device=x.device)
        mask[:, :keep] = 0
        mask = torch.gather(mask, 1, ids_restore)
        return kept, mask, ids_restore

    # ------------------------------------------------------------------ forward stages
    def forward_encoder(self, imgs: torch.Tensor, mask_ratio: float):
        """-> latent (B, 1+K, D), mask (B, N), ids_restore (B, N), skips (shallow -> deep)."""
        x = self.patch_embed(imgs) + self.pos_embed[:, 1:]  # (B, N, D)
        x, mask, ids_restore = self.random_masking(x, mask_ratio)  # (B, K, D)
        x = torch.cat([self.cls_with_pos(x.shape[0]), x], dim=1)  # (B, 1+K, D)
        x = expand_streams(self.hyper, x)  # hyper-connections: ((B n), 1+K, D); the decoder sees the streams' sum
        wanted, skips = set(self.skip_sources), []
        for i, blk in enumerate(self.blocks):
            x = run_block(self.hyper, i, blk, x)
            if i in wanted:
                skips.append(reduce_streams(self.hyper, x))
        return self.norm(reduce_streams(self.hyper, x)), mask, ids_restore, skips

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor, skips: list[torch.Tensor]) -> torch.Tensor:
        """-> per-patch pixel predictions (B, N, p*p*C)."""
        B = latent.shape[0]
        if self.cfg.skips:
            start = self.decoder_pos_embed.clone()
            start[:, :1] = start[:, :1] + self.decoder_cls_token
            x = self.decoder_embed(start).expand(B, -1, -1)  # (B, 1+N, Dd), same for every sample
        else:
            x = fill_and_unshuffle(self.decoder_embed(latent), ids_restore, self.mask_token)
            x = x + self.decoder_pos_embed  # (B, 1+N, Dd)
        for j, blk in enumerate(self.decoder_blocks):
            if j < len(self.skip_sources):
                x = self.skip_fusions[j](x, skips[-1 - j], ids_restore)  # deepest remaining skip
            x = blk(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]

    def forward_loss(self, imgs: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Mean squared error on removed patches; norm-pix targets normalise each patch."""
        target = self.patchify(imgs)
        if self.cfg.norm_pix_loss:
            mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
            target = (target - mean) / (var + 1e-6) ** 0.5
        loss = ((pred.float() - target) ** 2).mean(-1)  # (B, N)
        return (loss * mask).sum() / mask.sum().clamp_min(1.0)

    def forward(self, imgs: torch.Tensor, mask_ratio: float | None = None):
        ratio = self.cfg.mask_ratio if mask_ratio is None else mask_ratio
        latent, mask, ids_restore, skips = self.forward_encoder(imgs, ratio)
        pred = self.forward_decoder(latent, ids_restore, skips)
        return self.forward_loss(imgs, pred, mask), pred, mask

    # ------------------------------------------------------------------ cost model
    def flops_per_sample(self) -> float:
        """Analytic forward FLOPs of one training image (2 per multiply-add; matmuls only).
        Training costs about 3x this (forward + backward); used for MFU."""
        cfg, N = self.cfg, self.patch_embed.num_patches
        D, Dd, r = cfg.embed_dim, cfg.decoder_embed_dim, cfg.mlp_ratio
        Te = 1 + int(N * (1 - cfg.mask_ratio))
        Td = 1 + N

        f = 2 * N * cfg.in_chans * cfg.patch_size**2 * D  # patch embedding (all patches)
        f += self.encoder_flops(Te) + cfg.decoder_depth * block_flops(Td, Dd, r)
        if not cfg.skips:  # U-Net: decoder_embed runs once per batch on the content-free start
            f += 2 * Te * D * Dd
        # skip fusions: fc1's encoder half on the 1+K visible tokens only, its decoder half and fc2 on all
        f += len(self.skip_sources) * 2 * (Te * D * Dd + Td * 2 * Dd * Dd)
        f += 2 * Td * Dd * cfg.patch_size**2 * cfg.in_chans  # pixel head (cls row included)
        return float(f)
