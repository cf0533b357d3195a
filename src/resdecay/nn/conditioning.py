"""Conditioning pieces DiT introduced, shared by the diffusion transformers (SiT, U-ViT):
sinusoidal ``TimestepEmbedder``, ``LabelEmbedder`` with label dropout and a null label for
classifier-free guidance, adaLN's ``modulate``, the adaLN-Zero block and DiT's final layer.

Shapes: tokens (B, T, D); c = (B, D) conditioning.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from .blocks import Attention, Mlp
from .branch_scale import set_branch_scale
from .noise import draw
from .residual import factors_repr, residual_add, set_block_factors


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
            drop = draw(lambda n: torch.rand(n, device=labels.device), labels.shape[0]) < self.dropout
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


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(B, T, D) tokens, (B, D) shift/scale: adaLN's per-sample affine map."""
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class AdaLNBlock(nn.Module):
    """DiT's adaLN-Zero block with decayed identity shortcuts::

        x = alpha_attn * x + beta_attn * gate_msa * Attn(modulate(LN(x), shift_msa, scale_msa))
        x = alpha_mlp  * x + beta_mlp  * gate_mlp * MLP(modulate(LN(x), shift_mlp, scale_mlp))

    The six modulation vectors come from c through SiLU + Linear(D -> 6D). Zeroing that Linear
    (adaLN-Zero) zeroes both gates, so at init the block maps x -> alpha_attn * alpha_mlp * x, the
    same start the paper's branch zero-init gives a pre-LN block (paper-notes §1). The MLP's GELU
    is the tanh approximation by default, as DiT's and SiT's (``gelu="exact"`` for erf's).
    The factors (alpha, beta, learnable alpha) mean what they mean for ``Block``; the model's
    ``shortcut`` formula chooses them (``resdecay.nn.residual``). So do the branch gains and drops
    (``branch_scale``, ``layerscale_init``, ``drop_path``, ``drop_identity``; ``nn.branch_scale``): a gain
    multiplies the gated branch, ``ls1(gate_msa * Attn(...))``, and DropPath then drops it.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 alpha_attn: float = 1.0, alpha_mlp: float = 1.0, gelu: str = "tanh", beta_attn: float = 1.0,
                 beta_mlp: float = 1.0, learnable_alpha: bool | tuple[bool, bool] = False, update: str | None = None,
                 branch_scale: str = "none", layerscale_init: float = 1e-5, drop_path: float = 0.0,
                 drop_identity: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), gelu)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        set_block_factors(self, alpha_attn, alpha_mlp, beta_attn, beta_mlp, learnable_alpha, update)
        set_branch_scale(self, dim, branch_scale, layerscale_init, drop_path, drop_identity)

    grad_checkpointing = False  # nn.blocks.set_grad_checkpointing

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:  # (B, T, D), (B, D) -> (B, T, D)
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._residual_adds, x, c, use_reentrant=False)
        return self._residual_adds(x, c)

    def _residual_adds(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        attn, mlp = self.branches(c)
        x = residual_add(x, attn(x), self.drop_identity(self.alpha_attn, x), self.beta_attn, self.update_fn)
        return residual_add(x, mlp(x), self.drop_identity(self.alpha_mlp, x), self.beta_mlp, self.update_fn)

    def branches(self, c: torch.Tensor) -> tuple:
        """The two branches f(x) under conditioning c, as the adds receive them (adaLN gate, gain, stochastic
        depth): what the block's own adds and hyper-connections' streams (``nn.hyper``) both run."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)

        def attn(x: torch.Tensor) -> torch.Tensor:
            return self.drop_path(self.ls1(gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))))

        def mlp(x: torch.Tensor) -> torch.Tensor:
            return self.drop_path(self.ls2(gate_mlp.unsqueeze(1) * self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))))

        return attn, mlp

    def open_gates(self) -> None:
        """Start both adaLN gates at 1 instead of adaLN-Zero's 0 (the gate rows' bias set to 1; their weights keep
        their zero init): for a gain that starts at 0 itself (ReZero, SkipInit; ``nn.branch_scale``), which is then
        the block's zero start. A zero gate times a zero gain would give neither a gradient."""
        gates = self.adaLN_modulation[-1].bias.data.view(6, -1)  # shift, scale, gate (msa), shift, scale, gate (mlp)
        gates[2].fill_(1.0)
        gates[5].fill_(1.0)

    def extra_repr(self) -> str:
        return factors_repr(self)


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
