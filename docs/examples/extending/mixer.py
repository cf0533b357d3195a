"""docs/EXTENDING.md, example (b): a new model family in one file.

A tiny MLP-Mixer (Tolstikhin et al., 2021) with decayed identity shortcuts, pretrained as a masked
autoencoder: 75 % of the patch tokens are replaced by a learned mask token (a Mixer needs a fixed
token count, so masked tokens are swapped, not dropped), the Mixer encodes all tokens, a linear head
predicts the normalised pixels of the masked patches (MAE's norm-pix loss). Each block has two
residual adds, token mixing then channel mixing, both through ``residual_add`` with the factors of
the registered ``model.shortcut`` formula, so every formula and ``model.decay_branches`` work here
(``attn`` means the token-mixing add).

Run it with the unchanged CLI:
    resdecay --plugin docs/examples/extending/mixer.py pretrain --preset docs/examples/extending/mixer-digits.yaml
    resdecay --plugin docs/examples/extending/mixer.py eval runs/mixer-digits/checkpoints/last.pt
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from resdecay.models import ModelConfig, register_family
from resdecay.models.common import resolve_blocks
from resdecay.nn.blocks import Mlp, patchify
from resdecay.nn.residual import factors_repr, residual_add, set_block_factors, shortcut_plan
from resdecay.schedule import effective_decay


@dataclass
class MixerConfig(ModelConfig):
    family: str = "mixer"
    img_size: int = 8
    in_chans: int = 1
    patch_size: int = 2
    embed_dim: int = 64
    depth: int = 8
    token_hidden: int = 32  # hidden width of the token-mixing MLP
    channel_hidden: int = 128  # hidden width of the channel-mixing MLP
    alpha_min: float = 0.6
    schedule: str = "linear"
    shortcut: str = "decay"
    decay_branches: str = "both"
    mask_ratio: float = 0.75

    def validate(self) -> None:
        if self.img_size % self.patch_size:
            raise ValueError(f"model.img_size {self.img_size} must be divisible by model.patch_size {self.patch_size}")
        if not 0.0 < self.mask_ratio < 1.0:
            raise ValueError(f"model.mask_ratio must lie in (0, 1), got {self.mask_ratio}")
        shortcut_plan(self.depth, self.alpha_min, self.schedule, self.decay_branches, self.shortcut)  # one-line refusals


class MixerBlock(nn.Module):
    """x = a_tok * x + b_tok * TokenMLP(LN(x))ᵀ ;  x = a_ch * x + b_ch * ChannelMLP(LN(x))."""

    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int, factors: dict):
        super().__init__()
        self.norm1, self.token_mlp = nn.LayerNorm(dim, eps=1e-6), Mlp(tokens, token_hidden)
        self.norm2, self.channel_mlp = nn.LayerNorm(dim, eps=1e-6), Mlp(dim, channel_hidden)
        set_block_factors(self, **factors)  # alpha_attn / alpha_mlp / beta_*: read by residual_add and the stats
        for layer in (self.token_mlp.fc2, self.channel_mlp.fc2):  # zero-init branches (paper §3): start as the shortcut
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, D)
        mixed = self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)  # mix along tokens
        x = residual_add(x, mixed, self.alpha_attn, self.beta_attn)
        return residual_add(x, self.channel_mlp(self.norm2(x)), self.alpha_mlp, self.beta_mlp)

    def extra_repr(self) -> str:
        return factors_repr(self)


def mixer_objective(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return model(images)  # the forward returns the masked-patch loss (labels unused)


@register_family("mixer", config=MixerConfig, objective=mixer_objective, tiny=dict(embed_dim=16, depth=2))
class MaskedMixer(nn.Module):
    def __init__(self, cfg: MixerConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        n, patch = (cfg.img_size // cfg.patch_size) ** 2, cfg.patch_size**2 * cfg.in_chans
        plan = shortcut_plan(cfg.depth, cfg.alpha_min, cfg.schedule, cfg.decay_branches, cfg.shortcut)
        self.alphas = plan.alphas  # (depth, 2): what summaries and ablate tables report
        self.embed = nn.Linear(patch, cfg.embed_dim)
        self.pos = nn.Parameter(torch.zeros(1, n, cfg.embed_dim))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim))
        self.blocks = nn.ModuleList(
            MixerBlock(n, cfg.embed_dim, cfg.token_hidden, cfg.channel_hidden, factors) for factors in plan.block_kwargs())
        self.head = nn.Linear(cfg.embed_dim, patch)
        nn.init.normal_(self.pos, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)

    @property
    def decoder_blocks(self) -> nn.ModuleList:
        return nn.ModuleList()  # the contract: no decoder stack here

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def alpha_eff(self) -> float:
        return effective_decay(self.alphas)

    def run_blocks(self, x: torch.Tensor, indices: list[int] | None = None) -> list[torch.Tensor]:
        wanted, out = resolve_blocks(indices, self.num_blocks), {}
        for i, blk in enumerate(self.blocks[: max(wanted) + 1]):
            x = out[i] = blk(x)
        return [out[i] for i in wanted]

    def forward_intermediates(self, imgs: torch.Tensor, indices: list[int] | None = None) -> list[torch.Tensor]:
        """Unmasked block outputs (B, N, D) of the requested 0-indexed blocks (default: the last)."""
        return self.run_blocks(self.embed(patchify(imgs, self.cfg.patch_size)) + self.pos, indices)

    def forward_features(self, imgs: torch.Tensor) -> torch.Tensor:
        return self.forward_intermediates(imgs)[0]

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        target = patchify(imgs, self.cfg.patch_size)  # (B, N, p*p*C)
        B, N, _ = target.shape
        masked = torch.rand(B, N, device=imgs.device).argsort(1) < int(N * self.cfg.mask_ratio)  # (B, N) bool
        x = torch.where(masked[..., None], self.mask_token.expand(B, N, -1), self.embed(target)) + self.pos
        pred = self.head(self.run_blocks(x)[0])
        mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)  # MAE's norm-pix targets
        loss = ((pred - (target - mean) / (var + 1e-6).sqrt()) ** 2).mean(-1)  # (B, N)
        return (loss * masked).sum() / masked.sum()

    def flops_per_sample(self) -> float:
        c, n = self.cfg, (self.cfg.img_size // self.cfg.patch_size) ** 2
        per_block = 2 * (2 * n * c.token_hidden * c.embed_dim + 2 * n * c.channel_hidden * c.embed_dim)
        return float(c.depth * per_block + 2 * 2 * n * c.patch_size**2 * c.in_chans * c.embed_dim)
