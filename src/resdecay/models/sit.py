"""SiT (Ma et al., 2024): a DiT-style transformer with adaLN-Zero blocks on patch tokens, here with
decayed identity shortcuts and additive encoder->decoder long skips (paper-notes §3).

    plain SiT (= DiT's network)   alpha_min=1,   skips=False
    decayed SiT (the paper's)     alpha_min=0.8, skips=True

Block i uses the shortcut factors ``alpha_schedule(depth, alpha_min)[i]``: the decay runs through
the whole network and reaches alpha_min at the last block (paper-notes §1, §3).

This file also holds the conditioning pieces DiT introduced (sinusoidal ``TimestepEmbedder``,
``LabelEmbedder`` with label dropout and a null label for classifier-free guidance) and the helpers
both diffusion families share (``unpatchify``, ``validate_diffusion_config``, ``resolve_blocks``);
``uvit.py`` imports them from here.

Shapes: images (B, C, H, W); N = (H/p)^2 patch tokens of width D; c = (B, D) conditioning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..blocks import Attention, Mlp, PatchEmbed, decayed_add, init_linear_xavier, init_patch_embed, sincos_pos_embed_2d
from ..schedule import SCHEDULES, alpha_schedule

OBJECTIVES = ("ddpm-eps", "interp-v")  # epsilon prediction under DDPM | velocity of the linear interpolant
NOISE_SCHEDULES = ("linear", "cosine")


# ---------------------------------------------------------------------- shared by U-ViT and SiT
class BlockIndexError(IndexError, ValueError):
    """A block index outside the network; both an IndexError (like ViTEncoder's) and a ValueError."""


def resolve_blocks(indices: list[int] | None, depth: int) -> list[int]:
    """0-indexed block indices (negative counts from the end; None = the last) -> non-negative."""
    if indices is None:
        return [depth - 1]
    bad = [i for i in indices if not -depth <= int(i) < depth]
    if bad:
        raise BlockIndexError(f"block indices {bad} out of range: valid are 0..{depth - 1} (or -{depth}..-1)")
    return [int(i) % depth for i in indices]


def validate_diffusion_config(cfg, family: str) -> None:
    """The checks U-ViT and SiT configs share (the depth rule stays with each family)."""
    if cfg.family != family:
        raise ValueError(f"model.family must be {family!r} for this config, got {cfg.family!r}")
    for name in ("img_size", "in_chans", "patch_size", "embed_dim", "depth", "num_heads"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"model.{name} must be a positive integer, got {getattr(cfg, name)}")
    if not 0.0 < cfg.alpha_min <= 1.0:
        raise ValueError(f"model.alpha_min must lie in (0, 1] (1 = plain residual), got {cfg.alpha_min}")
    if cfg.schedule not in SCHEDULES:
        raise ValueError(f"model.schedule {cfg.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
    if cfg.img_size % cfg.patch_size:
        good = [p for p in range(1, cfg.img_size + 1) if cfg.img_size % p == 0]
        raise ValueError(f"image size {cfg.img_size} is not divisible by patch size {cfg.patch_size}; use model.patch_size in {good}")
    if cfg.embed_dim % cfg.num_heads:
        raise ValueError(f"model.embed_dim {cfg.embed_dim} must be divisible by model.num_heads {cfg.num_heads}")
    if cfg.objective not in OBJECTIVES:
        raise ValueError(f"model.objective {cfg.objective!r} is unknown; choose one of {', '.join(OBJECTIVES)}")
    if cfg.noise_schedule not in NOISE_SCHEDULES:
        raise ValueError(f"model.noise_schedule {cfg.noise_schedule!r} is unknown; choose one of {', '.join(NOISE_SCHEDULES)}")
    if cfg.num_classes < 0:
        raise ValueError(f"model.num_classes must be >= 0 (0 = unconditional), got {cfg.num_classes}")
    if not 0.0 <= cfg.class_dropout < 1.0:
        raise ValueError(f"model.class_dropout must lie in [0, 1), got {cfg.class_dropout}")


def unpatchify(x: torch.Tensor, patch_size: int, chans: int) -> torch.Tensor:
    """(B, N, p*p*C) -> (B, C, H, W); patches row-major, pixels (p, q, c) as DiT / MAE."""
    B, N, _ = x.shape
    g, p = math.isqrt(N), patch_size
    x = torch.einsum("nhwpqc->nchpwq", x.reshape(B, g, g, p, p, chans))
    return x.reshape(B, chans, g * p, g * p)


class TimestepEmbedder(nn.Module):
    """DiT's: sinusoidal features of a scalar t (256 frequencies, periods up to 10^4) -> MLP.
    Works for DDPM's integer steps 0..999 and for the interpolant's t in [0, 1] (SiT feeds it raw)."""

    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    @staticmethod
    def sinusoid(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:  # (B,) -> (B, dim)
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
        args = t.float()[:, None] * freqs[None]
        emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
        return torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1) if dim % 2 else emb

    def forward(self, t: torch.Tensor) -> torch.Tensor:  # (B,) -> (B, D)
        return self.mlp(self.sinusoid(t, self.freq_dim).to(self.mlp[0].weight.dtype))


class LabelEmbedder(nn.Module):
    """Class labels -> vectors; row ``num_classes`` is the null label of classifier-free guidance.
    In training each label is replaced by the null label with probability ``dropout`` (DiT)."""

    def __init__(self, num_classes: int, dim: int, dropout: float):
        super().__init__()
        self.num_classes, self.dropout = num_classes, dropout
        self.embedding_table = nn.Embedding(num_classes + 1, dim)

    def forward(self, labels: torch.Tensor, train: bool, force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        if force_drop_ids is not None:
            labels = torch.where(force_drop_ids == 1, self.num_classes, labels)
        elif train and self.dropout > 0:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout
            labels = torch.where(drop, self.num_classes, labels)
        return self.embedding_table(labels)  # (B, D)


def embed_labels(embedder: LabelEmbedder | None, y: torch.Tensor | None, batch: int, device, train: bool,
                 force_drop_ids: torch.Tensor | None = None) -> torch.Tensor | None:
    """Label vectors (B, D), or None for an unconditional model; y=None means the null label."""
    if embedder is None:
        if y is not None:
            raise ValueError("labels y were given to an unconditional model (model.num_classes=0); pass y=None "
                             "or build a class-conditional model with model.num_classes > 0")
        return None
    if y is None:
        y = torch.full((batch,), embedder.num_classes, dtype=torch.long, device=device)
    return embedder(y, train, force_drop_ids)


# ---------------------------------------------------------------------- SiT
@dataclass
class SiTConfig:
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
    schedule: str = "linear"  # see resdecay.schedule
    skips: bool = True  # additive long skips between mirrored halves (paper-notes §3)
    zero_init: bool = True  # zero the skip Linears (adaLN-Zero and the zero final layer are always on)
    objective: str = "interp-v"  # stored for the loss/sampler module: ddpm-eps | interp-v (SiT's)
    noise_schedule: str = "linear"  # stored only: linear | cosine (DDPM betas / interpolant path)

    def validate(self) -> None:
        validate_diffusion_config(self, "sit")
        if self.embed_dim % 4:
            raise ValueError(f"model.embed_dim {self.embed_dim} must be divisible by 4 (2-D sin-cos positions)")
        if self.skips and (self.depth < 2 or self.depth % 2):
            raise ValueError(f"model.depth {self.depth} must be even and >= 2 when model.skips is on "
                             "(the network splits into two mirrored halves); or set model.skips=false")


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(B, T, D) tokens, (B, D) shift/scale: adaLN's per-sample affine map."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class AdaLNBlock(nn.Module):
    """DiT's adaLN-Zero block with decayed identity shortcuts::

        x = alpha_attn * x + gate_msa * Attn(modulate(LN(x), shift_msa, scale_msa))
        x = alpha_mlp  * x + gate_mlp * MLP(modulate(LN(x), shift_mlp, scale_mlp))

    The six modulation vectors come from c through SiLU + Linear(D -> 6D). Zeroing that Linear
    (adaLN-Zero) zeroes both gates, so at init the block maps x -> alpha_attn * alpha_mlp * x, the
    same start the paper's branch zero-init gives a pre-LN block (paper-notes §1). The MLP's GELU
    is the exact one of blocks.Mlp (DiT uses the tanh approximation; same parameters).
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 alpha_attn: float = 1.0, alpha_mlp: float = 1.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.alpha_attn, self.alpha_mlp = float(alpha_attn), float(alpha_mlp)  # fixed numbers, not parameters

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:  # (B, T, D), (B, D) -> (B, T, D)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        x = decayed_add(x, gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa)), self.alpha_attn)
        x = decayed_add(x, gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp)), self.alpha_mlp)
        return x

    def extra_repr(self) -> str:
        return f"alpha_attn={self.alpha_attn:.4f}, alpha_mlp={self.alpha_mlp:.4f}"


class FinalLayer(nn.Module):
    """adaLN LayerNorm + Linear(D -> p*p*C): tokens -> per-patch predictions (DiT)."""

    def __init__(self, dim: int, patch_size: int, out_chans: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, patch_size * patch_size * out_chans)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, p*p*C)
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=1)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class SiT(nn.Module):
    def __init__(self, cfg: SiTConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        D = cfg.embed_dim
        self.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, D)
        N = self.patch_embed.num_patches
        self.num_prefix_tokens = 0  # SiT has patch tokens only
        self.t_embedder = TimestepEmbedder(D)
        self.y_embedder = LabelEmbedder(cfg.num_classes, D, cfg.class_dropout) if cfg.num_classes > 0 else None
        self.pos_embed = nn.Parameter(torch.zeros(1, N, D), requires_grad=False)  # fixed sin-cos (DiT)
        self.alphas = alpha_schedule(cfg.depth, cfg.alpha_min, cfg.schedule)  # (depth, 2) over ALL blocks
        self.num_blocks = cfg.depth
        self.blocks = nn.ModuleList(AdaLNBlock(D, cfg.num_heads, cfg.mlp_ratio, cfg.qkv_bias, a, m)
                                    for a, m in self.alphas.tolist())
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
        # 3. zero_init: the skip Linears start silent, so the skips join the network gradually and
        #    cannot carry a shortcut around the decay at init (paper-notes §1, §3).
        if cfg.zero_init:
            for lin in self.skip_linears:
                nn.init.zeros_(lin.weight)

    def condition(self, t: torch.Tensor, y: torch.Tensor | None, batch: int,
                  force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:  # -> c (B, D)
        c = self.t_embedder(t)
        cy = embed_labels(self.y_embedder, y, batch, t.device, self.training, force_drop_ids)
        return c if cy is None else c + cy

    def _run(self, x, t, y, keep=(), upto=None, force_drop_ids=None):
        """Embed and run blocks [0, upto); -> (final tokens (B, N, D), c, {block: output})."""
        x = self.patch_embed(x) + self.pos_embed  # (B, N, D)
        c = self.condition(t, y, x.shape[0], force_drop_ids)  # (B, D)
        skips, out = [], {}
        for i, blk in enumerate(self.blocks[:upto]):
            if self.cfg.skips and i >= self.half:
                x = x + self.skip_linears[i - self.half](skips.pop())  # deepest remaining encoder output
            x = blk(x, c)
            if self.cfg.skips and i < self.half:
                skips.append(x)
            if i in keep:
                out[i] = x
        return x, c, out

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None,
                force_drop_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, H, W) noisy input, (B,) timesteps, (B,) labels -> (B, C, H, W) prediction."""
        tokens, c, _ = self._run(x, t, y, force_drop_ids=force_drop_ids)
        return unpatchify(self.final_layer(tokens, c), self.cfg.patch_size, self.cfg.in_chans)

    def forward_intermediates(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None = None,
                              indices: list[int] | None = None) -> list[torch.Tensor]:
        """Outputs (B, N, D) of the requested blocks (0-indexed over the whole network)."""
        wanted = resolve_blocks(indices, self.num_blocks)
        _, _, out = self._run(x, t, y, keep=set(wanted), upto=max(wanted) + 1)
        return [out[i] for i in wanted]

    def flops_per_sample(self) -> float:
        """Analytic forward matmul FLOPs of one sample (2 per multiply-add), as MAE's."""
        cfg, N = self.cfg, self.patch_embed.num_patches
        D, r, out = cfg.embed_dim, cfg.mlp_ratio, cfg.patch_size**2 * cfg.in_chans
        block = 2 * N * (4 * D * D + 2 * r * D * D) + 4 * N * N * D + 2 * D * 6 * D  # + adaLN modulation
        f = 2 * N * out * D  # patch embedding
        f += 2 * (self.t_embedder.freq_dim * D + D * D)  # timestep MLP
        f += cfg.depth * block + len(self.skip_linears) * 2 * N * D * D
        f += 2 * D * 2 * D + 2 * N * D * out  # final adaLN + linear
        return float(f)


__all__ = ["AdaLNBlock", "BlockIndexError", "FinalLayer", "LabelEmbedder", "NOISE_SCHEDULES", "OBJECTIVES", "SiT",
           "SiTConfig", "TimestepEmbedder", "embed_labels", "modulate", "resolve_blocks", "unpatchify",
           "validate_diffusion_config"]
