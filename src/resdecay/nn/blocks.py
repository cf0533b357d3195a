"""Building blocks shared by every model family: attention, MLP, the decayed pre-LN block,
patch embedding and fixed sin-cos position tables. The residual add and its factors are
``resdecay.nn.residual``'s.

Parameter names follow timm / facebookresearch/mae (``norm1``, ``attn.qkv``, ``attn.proj``,
``norm2``, ``mlp.fc1``, ``mlp.fc2``) so that checkpoints written by those projects map onto
ours key for key.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .branch_scale import drop_path_module as drop_path_module  # re-exported: its older home
from .branch_scale import set_branch_scale, starts_silent
from .residual import decayed_add as decayed_add  # re-exported: the add's older name, kept for callers
from .residual import factors_repr, residual_add, set_block_factors


class Attention(nn.Module):
    """Multi-head self-attention through PyTorch's fused SDPA kernel."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"width {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, D // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, D/H)
        x = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, D/H)
        return self.proj(x.transpose(1, 2).reshape(B, T, D))


class Mlp(nn.Module):
    """Linear -> GELU -> Linear. ``gelu="exact"`` is ViT's / MAE's; DiT and SiT use the tanh
    approximation (``"tanh"``). Same parameters either way, outputs differ by ~1e-4."""

    def __init__(self, dim: int, hidden: int, gelu: str = "exact"):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="none" if gelu == "exact" else gelu)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN transformer block with decayed identity shortcuts::

        x = alpha_attn * x + beta_attn * DropPath(ls1(Attn(LN(x))))
        x = alpha_mlp  * x + beta_mlp  * DropPath(ls2(MLP(LN(x))))

    With ``alpha_attn = alpha_mlp = 1`` this is the standard ViT block (timm's ``Block``); ``ls1`` / ``ls2`` are
    the branch gains (identities unless ``branch_scale``; ``nn.branch_scale``).

    Args:
        dim: token width D.
        num_heads: attention heads; must divide ``dim``.
        mlp_ratio: MLP hidden width as a multiple of ``dim``.
        qkv_bias: bias on the qkv projection.
        alpha_attn: shortcut factor of the attention sub-block (1 = plain residual).
        alpha_mlp: shortcut factor of the MLP sub-block.
        norm_eps: LayerNorm epsilon (1e-6 as MAE).
        zero_init: zero the last layer of both branches (paper §3, ``zero_init_branches``).
        drop_path: stochastic-depth rate of the branches (``model.drop_branch`` at this depth).
        learnable_alpha: make the alphas trained scalars (Table 3a), both (True) or per add
            ``(attn, mlp)``; otherwise they are plain Python floats recorded by the model's config,
            so a checkpoint rebuilds the same network.
        beta_attn: branch factor of the attention sub-block (Table 3b's sqrt(0.5) variants).
        beta_mlp: branch factor of the MLP sub-block.
        update: a registered residual update both adds apply to their branch (``nn.updates``: ``orthogonal``).
        branch_scale: none | rezero | layerscale | skipinit: a learned gain on each branch (``nn.branch_scale``).
        layerscale_init: LayerScale's initial gain (epsilon).
        drop_identity: stochastic-depth rate of the shortcut (per sample, training only).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        alpha_attn: float = 1.0,
        alpha_mlp: float = 1.0,
        norm_eps: float = 1e-6,
        zero_init: bool = False,
        drop_path: float = 0.0,
        learnable_alpha: bool | tuple[bool, bool] = False,
        beta_attn: float = 1.0,
        beta_mlp: float = 1.0,
        update: str | None = None,
        branch_scale: str = "none",
        layerscale_init: float = 1e-5,
        drop_identity: float = 0.0,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qkv_bias)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        set_block_factors(self, alpha_attn, alpha_mlp, beta_attn, beta_mlp, learnable_alpha, update)
        set_branch_scale(self, dim, branch_scale, layerscale_init, drop_path, drop_identity)
        if zero_init:
            self.zero_init_branches()

    grad_checkpointing = False  # set_grad_checkpointing: recompute this block's activations in the backward pass

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._residual_adds, x, use_reentrant=False)
        return self._residual_adds(x)

    def _residual_adds(self, x: torch.Tensor) -> torch.Tensor:
        attn, mlp = self.branches()
        x = residual_add(x, attn(x), self.drop_identity(self.alpha_attn, x), self.beta_attn, self.update_fn)
        return residual_add(x, mlp(x), self.drop_identity(self.alpha_mlp, x), self.beta_mlp, self.update_fn)

    def branches(self) -> tuple:
        """The two branches f(x) as the adds receive them (gain, then stochastic depth): what the block's own
        adds and hyper-connections' streams (``nn.hyper``) both run."""
        return self._attn_branch, self._mlp_branch

    def _attn_branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop_path(self.ls1(self.attn(self.norm1(x))))

    def _mlp_branch(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop_path(self.ls2(self.mlp(self.norm2(x))))


    def zero_init_branches(self) -> None:
        """Zero each branch's last layer so the block starts as ``x -> alpha_attn*alpha_mlp*x``.

        Paper §3 ("residual zero initialization"): without it feature norms explode for
        alpha_min <= 0.7, because the branches learn to out-shout the decayed shortcut.
        A gain that starts at 0 (ReZero, SkipInit) is already that start; zeroing the layer too would leave
        both factors of the branch without a gradient, so the layers keep their init.
        """
        if starts_silent(self):
            return
        for layer in (self.attn.proj, self.mlp.fc2):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def extra_repr(self) -> str:
        return factors_repr(self)


class PatchEmbed(nn.Module):
    """Image (B, C, H, W) -> patch tokens (B, N, D) with one strided convolution."""

    def __init__(self, img_size: int, patch_size: int, in_chans: int, dim: int):
        super().__init__()
        if img_size % patch_size:
            raise ValueError(f"image size {img_size} is not divisible by patch size {patch_size}")
        self.img_size, self.patch_size = img_size, patch_size
        self.grid = img_size // patch_size
        self.num_patches = self.grid**2
        self.proj = nn.Conv2d(in_chans, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)  # (B, D, g, g) -> (B, N, D)


def sincos_pos_embed_2d(dim: int, grid: int, cls_token: bool = True) -> torch.Tensor:
    """Fixed 2-D sin-cos position table (MAE's), shape (grid*grid [+1], dim); the cls slot is 0."""
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs a width divisible by 4, got {dim}")

    def one_axis(d: int, pos: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)  # (M, d/2)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    # MAE's convention: first half of the channels encodes the column, second half the row.
    col, row = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64))
    table = np.concatenate([one_axis(dim // 2, col), one_axis(dim // 2, row)], axis=1)
    if cls_token:
        table = np.concatenate([np.zeros((1, dim)), table], axis=0)
    return torch.from_numpy(table).float()


def init_linear_xavier(module: nn.Module) -> None:
    """ViT/MAE default: xavier-uniform Linear weights, zero biases, unit LayerNorms."""
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)


def init_patch_embed(patch_embed: PatchEmbed, zero_bias: bool = True) -> None:
    """Initialise the patch projection like a Linear (xavier on the flattened kernel), as MAE and
    DiT do. DiT / SiT / U-ViT here also zero its bias; MAE leaves the bias at PyTorch's default
    uniform(+-1/sqrt(fan_in)) init (``zero_bias=False``; facebookresearch/mae ``initialize_weights``)."""
    w = patch_embed.proj.weight.data
    nn.init.xavier_uniform_(w.view(w.shape[0], -1))
    if zero_bias:
        nn.init.zeros_(patch_embed.proj.bias)



def patchify(imgs: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, p*p*C), patches in row-major order, pixels (p, q, c) as MAE / DiT."""
    B, C, H, _ = imgs.shape
    p = patch_size
    g = H // p
    x = imgs.reshape(B, C, g, p, g, p)
    return torch.einsum("nchpwq->nhwpqc", x).reshape(B, g * g, p * p * C)


def unpatchify(x: torch.Tensor, patch_size: int, chans: int) -> torch.Tensor:
    """(B, N, p*p*C) -> (B, C, H, W); the inverse of ``patchify``."""
    B, N, _ = x.shape
    g, p = math.isqrt(N), patch_size
    x = torch.einsum("nhwpqc->nchpwq", x.reshape(B, g, g, p, p, chans))
    return x.reshape(B, chans, g * p, g * p)


def block_flops(tokens: int, dim: int, mlp_ratio: float) -> float:
    """Forward matmul FLOPs of one pre-LN transformer block on ``tokens`` tokens (2 per
    multiply-add): qkv + proj + MLP, then QK^T and AV. Used for MFU by every family."""
    d, r = dim, mlp_ratio
    return 2 * tokens * (4 * d * d + 2 * r * d * d) + 4 * tokens * tokens * d
