"""Fidelity to the authors' code where resdecay once differed (issue 13): SiT's MLP GELU (tanh
approximation), SiT's long-skip Linear init (xavier weights, zero bias), and the MAE patch
embedding's conv bias (PyTorch's default uniform init). Each is pinned against a small reference
written here the way DiT's / SiT's ``models.py`` and facebookresearch/mae's ``models_mae.py`` write it."""

import math

import torch
import torch.nn as nn

from resdecay.models.mae import MAEConfig, MaskedAutoencoder
from resdecay.models.sit import AdaLNBlock, SiT, SiTConfig
from resdecay.train.checkpoint import FORMAT, load_model

D, HEADS = 32, 2


class ReferenceDiTBlock(nn.Module):
    """DiT's / SiT's ``DiTBlock`` (models.py), written out: timm Attention + Mlp with
    ``GELU(approximate="tanh")``, adaLN-Zero modulation."""

    def __init__(self):
        super().__init__()
        self.norm1 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.norm2 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.fc1, self.act, self.fc2 = nn.Linear(D, 4 * D), nn.GELU(approximate="tanh"), nn.Linear(4 * D, D)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(D, 6 * D))

    def attn(self, x):
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-2, -1)) / math.sqrt(D // HEADS)).softmax(-1)
        return self.proj((a @ v).transpose(1, 2).reshape(B, N, D))

    def forward(self, x, c):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        mod = lambda h, shift, scale: h * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)
        x = x + gate_msa.unsqueeze(1) * self.attn(mod(self.norm1(x), shift_msa, scale_msa))
        return x + gate_mlp.unsqueeze(1) * self.fc2(self.act(self.fc1(mod(self.norm2(x), shift_mlp, scale_mlp))))


def _copy_into(ours: AdaLNBlock, ref: ReferenceDiTBlock) -> None:
    with torch.no_grad():
        for name, src in [("attn.qkv", ref.qkv), ("attn.proj", ref.proj), ("mlp.fc1", ref.fc1), ("mlp.fc2", ref.fc2),
                          ("adaLN_modulation.1", ref.adaLN_modulation[1])]:
            dst = ours.get_submodule(name)
            dst.weight.copy_(src.weight)
            dst.bias.copy_(src.bias)


def test_sit_block_matches_dit_block_with_tanh_gelu_by_default():
    torch.manual_seed(0)
    ref = ReferenceDiTBlock().double()
    for p in ref.parameters():  # random everything (adaLN-Zero would hide the MLP at init)
        nn.init.normal_(p, std=0.3)
    x, c = torch.randn(2, 5, D, dtype=torch.float64), torch.randn(2, D, dtype=torch.float64)
    ours = AdaLNBlock(D, HEADS).double()
    _copy_into(ours, ref)
    torch.testing.assert_close(ours(x, c), ref(x, c), rtol=0, atol=1e-12)
    exact = AdaLNBlock(D, HEADS, gelu="exact").double()  # the switch still gives erf's GELU
    _copy_into(exact, ref)
    assert (exact(x, c) - ref(x, c)).abs().max() > 1e-6
    assert SiTConfig().gelu == "tanh" and SiT(SiTConfig(img_size=8, in_chans=2, embed_dim=D, depth=2, num_heads=HEADS,
                                                        gelu="exact")).blocks[0].mlp.act.approximate == "none"


def test_sit_skip_linears_start_as_the_authors_xavier_with_zero_bias():
    torch.manual_seed(0)
    model = SiT(SiTConfig(img_size=8, in_chans=2, embed_dim=64, depth=8, num_heads=2))
    bound = math.sqrt(6 / (64 + 64))  # xavier_uniform_ on a (D, D) weight
    for lin in model.skip_linears:
        w = lin.weight
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
        assert abs(w.std().item() - bound / math.sqrt(3)) < 0.1 * bound  # uniform(-b, b) has std b/sqrt(3)
        assert torch.all(lin.bias == 0)
    zeroed = SiT(SiTConfig(img_size=8, in_chans=2, embed_dim=64, depth=8, num_heads=2, zero_init=True))
    assert all(torch.all(lin.weight == 0) and torch.all(lin.bias == 0) for lin in zeroed.skip_linears)


def test_mae_patch_embed_bias_keeps_pytorch_default_init():
    torch.manual_seed(0)
    cfg = MAEConfig(img_size=16, in_chans=3, patch_size=4, embed_dim=64, depth=2, num_heads=2,
                    decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2)
    proj = MaskedAutoencoder(cfg).patch_embed.proj
    fan_in = 3 * 4 * 4
    assert proj.bias.abs().max() <= 1 / math.sqrt(fan_in) and proj.bias.std() > 0.3 / math.sqrt(fan_in)
    # the weight is initialised like a Linear's (xavier on the flattened kernel), as MAE does
    assert proj.weight.abs().max() <= math.sqrt(6 / (fan_in + 64))


def test_old_sit_checkpoint_rebuilds_with_exact_gelu(tmp_path):
    """A SiT checkpoint from before the tanh default records no ``gelu``: it was trained with exact
    GELU and zero-initialised skips, and must rebuild that function."""
    cfg = dict(family="sit", img_size=8, in_chans=2, patch_size=2, embed_dim=D, depth=2, num_heads=HEADS, alpha_min=0.8)
    model = SiT(SiTConfig(**cfg, gelu="exact"))
    path = tmp_path / "old.pt"
    torch.save({"format": FORMAT, "model": model.state_dict(), "config": {"model": cfg}}, path)
    loaded, run_cfg = load_model(path)
    assert run_cfg.model.gelu == "exact" and loaded.blocks[0].mlp.act.approximate == "none"
