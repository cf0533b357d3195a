from functools import partial

import numpy as np
import torch

from resdecay.nn.blocks import Attention, Block, decayed_add, sincos_pos_embed_2d


def test_zero_init_block_maps_x_to_alpha_product_times_x_exactly():
    torch.manual_seed(0)
    blk = Block(32, 4, alpha_attn=0.9, alpha_mlp=0.8, zero_init=True)
    x = torch.randn(3, 7, 32)
    y = blk(x)
    assert torch.equal(y, (x * 0.9) * 0.8)  # bit-exact: both branches are exactly zero
    assert torch.allclose(y, 0.72 * x, atol=1e-6)


def test_plain_block_is_standard_pre_ln_residual():
    torch.manual_seed(0)
    blk = Block(16, 2)
    x = torch.randn(2, 5, 16)
    h = x + blk.attn(blk.norm1(x))
    assert torch.allclose(blk(x), h + blk.mlp(blk.norm2(h)), atol=1e-6)


def test_decay_scales_identity_never_branch():
    x, f = torch.randn(4, 3), torch.randn(4, 3)
    assert torch.allclose(decayed_add(x, f, 0.7), 0.7 * x + f)
    assert torch.equal(decayed_add(x, f, 1.0), x + f)
    torch.manual_seed(0)
    blk = Block(16, 2, alpha_attn=0.5, alpha_mlp=0.25)
    x = torch.randn(2, 5, 16)
    h = 0.5 * x + blk.attn(blk.norm1(x))
    assert torch.allclose(blk(x), 0.25 * h + blk.mlp(blk.norm2(h)), atol=1e-6)


def test_sdpa_attention_equals_naive_attention():
    torch.manual_seed(0)
    attn = Attention(32, 4)
    x = torch.randn(2, 9, 32)
    B, T, D = x.shape
    q, k, v = attn.qkv(x).reshape(B, T, 3, 4, 8).permute(2, 0, 3, 1, 4)
    w = (q @ k.transpose(-2, -1) / 8**0.5).softmax(-1)
    ref = attn.proj((w @ v).transpose(1, 2).reshape(B, T, D))
    assert torch.allclose(attn(x), ref, atol=1e-5)


def test_block_matches_timm_block_key_for_key():
    from timm.models.vision_transformer import Block as TimmBlock

    torch.manual_seed(0)
    ours = Block(64, 4)
    ref = TimmBlock(64, 4, qkv_bias=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6))
    missing, unexpected = ref.load_state_dict(ours.state_dict(), strict=False)
    assert not missing and not unexpected
    x = torch.randn(2, 10, 64)
    assert torch.allclose(ours(x), ref(x), atol=1e-5)


def _mae_reference_sincos(embed_dim, grid_size):
    """facebookresearch/mae util/pos_embed.py, re-derived here as the reference."""
    def one(d, pos):
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)
    grid_h = np.arange(grid_size, dtype=np.float32)
    grid_w = np.arange(grid_size, dtype=np.float32)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0)
    emb = np.concatenate([one(embed_dim // 2, grid[0]), one(embed_dim // 2, grid[1])], axis=1)
    return np.concatenate([np.zeros([1, embed_dim]), emb], axis=0)


def test_sincos_table_matches_mae_convention():
    ours = sincos_pos_embed_2d(64, 4)
    assert ours.shape == (17, 64) and torch.all(ours[0] == 0)
    assert np.allclose(ours.numpy(), _mae_reference_sincos(64, 4), atol=1e-6)
