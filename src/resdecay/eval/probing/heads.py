"""Attentive probe heads: what reads a frozen encoder's patch tokens instead of one pooled vector.

* ``EfficientProbing`` is efficient-probing's EP (billpsomas/efficient-probing, ``poolings/ep.py``; "Attention,
  Please!", ICLR 2026): Q learned queries attend over the tokens used directly as keys (no key projection), one
  value projection D -> D / d_out whose output is split into Q chunks, query q pooling chunk q with its own
  attention; the Q pooled chunks are concatenated (width D / d_out). Its probe is that pooling, a non-affine
  BatchNorm (eps 1e-6) and a linear classifier (their ``probe_heads.py``).
* ``AttentivePooler`` is V-JEPA's (facebookresearch/jepa, ``src/models/attentive_pooler.py``): one learned query, a
  cross-attention block (LayerNorm on the tokens, q / kv projections, output projection, then an MLP on the query),
  then ``depth - 1`` self-attention blocks on the queries; ``AttentiveClassifier`` puts a linear layer after it.

Both are written here so that they run without those repositories; ``tests/eval/test_probing_heads.py`` checks
their forward and gradient against outputs of the originals (see there how the reference numbers were made).
Shapes: tokens (B, N, D) -> pooled (B, width) -> logits (B, C).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class EfficientProbing(nn.Module):
    """EP pooling: (B, N, D) tokens -> (B, D // d_out).

    Args:
        dim: the token width D; num_queries: Q (D // d_out must be a multiple of Q); d_out: the value projection's
            reduction (1 keeps the width).
    """

    def __init__(self, dim: int, num_queries: int = 32, d_out: int = 1):
        super().__init__()
        if num_queries < 1 or d_out < 1 or dim % d_out or (dim // d_out) % num_queries:
            raise ValueError(f"EP needs the value width dim / d_out ({dim} / {d_out}) to split into num_queries "
                             f"({num_queries}) equal chunks")
        self.num_queries, self.d_out = num_queries, d_out
        self.scale = dim ** -0.5  # one head: the head dimension is D
        self.v = nn.Linear(dim, dim // d_out, bias=False)
        self.cls_token = nn.Parameter(torch.randn(1, num_queries, dim) * 0.02)  # the Q learned queries

    @property
    def width(self) -> int:
        return self.v.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, D = x.shape
        q = self.cls_token.expand(B, -1, -1) * self.scale  # (B, Q, D)
        attn = (q @ x.transpose(1, 2)).softmax(dim=-1)  # (B, Q, N): the tokens themselves are the keys
        v = self.v(x).reshape(B, N, self.num_queries, -1).permute(0, 2, 1, 3)  # (B, Q, N, width / Q)
        pooled = (attn.unsqueeze(2) @ v).squeeze(2)  # (B, Q, width / Q): query q pools its own chunk
        return pooled.reshape(B, self.width)


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _CrossAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool):
        super().__init__()
        self.num_heads = num_heads
        self.q, self.kv, self.proj = nn.Linear(dim, dim, bias=qkv_bias), nn.Linear(dim, 2 * dim, bias=qkv_bias), nn.Linear(dim, dim)

    def forward(self, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        (B, n, C), N, h = q.shape, x.shape[1], self.num_heads
        q = self.q(q).reshape(B, n, h, C // h).transpose(1, 2)  # (B, h, n, C/h)
        k, v = self.kv(x).reshape(B, N, 2, h, C // h).permute(2, 0, 3, 1, 4)  # each (B, h, N, C/h)
        # no self.proj here: V-JEPA's CrossAttention builds the projection but its forward never applies it (the
        # parameter is kept, untrained, so that their state dicts load; tests/eval/test_probing_heads.py)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, n, C)


class _CrossAttentionBlock(nn.Module):
    """V-JEPA's: the tokens are normalised, the query is not; then an MLP on the query (pre-norm)."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool):
        super().__init__()
        self.norm1, self.xattn = nn.LayerNorm(dim), _CrossAttention(dim, num_heads, qkv_bias)
        self.norm2, self.mlp = nn.LayerNorm(dim), _Mlp(dim, int(dim * mlp_ratio))

    def forward(self, q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q = q + self.xattn(q, self.norm1(x))
        return q + self.mlp(self.norm2(q))


class _SelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, qkv_bias: bool):
        super().__init__()
        self.num_heads = num_heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=qkv_bias), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (B, N, C), h = x.shape, self.num_heads
        q, k, v = self.qkv(x).reshape(B, N, 3, h, C // h).permute(2, 0, 3, 1, 4)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, C))


class _SelfAttentionBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, qkv_bias: bool):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), _SelfAttention(dim, num_heads, qkv_bias)
        self.norm2, self.mlp = nn.LayerNorm(dim), _Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class AttentivePooler(nn.Module):
    """V-JEPA's attentive pooler: (B, N, D) -> (B, num_queries, D).

    Args:
        dim: D; num_heads: attention heads (D must divide by it); depth: 1 cross-attention block, then depth - 1
            self-attention blocks over the queries; mlp_ratio, qkv_bias: as V-JEPA's defaults.
    """

    def __init__(self, dim: int, num_heads: int = 12, depth: int = 1, num_queries: int = 1, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, init_std: float = 0.02):
        super().__init__()
        if depth < 1 or num_heads < 1 or dim % num_heads:
            raise ValueError(f"the attentive pooler needs depth >= 1 and a width ({dim}) that num_heads ({num_heads}) divides")
        self.query_tokens = nn.Parameter(torch.zeros(1, num_queries, dim))
        self.cross_attention_block = _CrossAttentionBlock(dim, num_heads, mlp_ratio, qkv_bias)
        self.blocks = nn.ModuleList(_SelfAttentionBlock(dim, num_heads, mlp_ratio, qkv_bias) for _ in range(depth - 1))
        self.initialize_weights(init_std)

    def initialize_weights(self, init_std: float) -> None:
        """V-JEPA's: truncated-normal Linear weights and queries (std 0.02), zero biases, unit LayerNorms; each
        block's output projections divided by sqrt(2 * its layer id) (the cross block is layer 1)."""
        def init(m: nn.Module) -> None:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=init_std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

        nn.init.trunc_normal_(self.query_tokens, std=init_std)
        self.apply(init)  # in V-JEPA's order (children first), so a seed draws what theirs draws
        with torch.no_grad():
            self.cross_attention_block.xattn.proj.weight.div_(math.sqrt(2.0))
            self.cross_attention_block.mlp.fc2.weight.div_(math.sqrt(2.0))
            for layer_id, blk in enumerate(self.blocks, 2):
                blk.attn.proj.weight.div_(math.sqrt(2.0 * layer_id))
                blk.mlp.fc2.weight.div_(math.sqrt(2.0 * layer_id))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.cross_attention_block(self.query_tokens.repeat(len(x), 1, 1), x)
        for blk in self.blocks:
            q = blk(q)
        return q


def ep_probe(dim: int, num_classes: int, num_queries: int = 32, d_out: int = 1) -> nn.Sequential:
    """efficient-probing's EP probe: EP pooling, non-affine BatchNorm (eps 1e-6), a linear classifier."""
    pool = EfficientProbing(dim, num_queries, d_out)
    return nn.Sequential(pool, nn.BatchNorm1d(pool.width, affine=False, eps=1e-6), nn.Linear(pool.width, num_classes))


class AttentiveClassifier(nn.Module):
    """V-JEPA's attentive classifier: the pooler's one query, then a linear layer."""

    def __init__(self, dim: int, num_classes: int, num_heads: int = 12, depth: int = 1):
        super().__init__()
        self.pooler = AttentivePooler(dim, num_heads, depth)
        self.linear = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.pooler(x).squeeze(1))
