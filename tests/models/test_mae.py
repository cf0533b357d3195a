import pytest
import torch

from helpers import DIGITS_IMAGE, tiny_config
from resdecay.models import MaskedAutoencoder, build_model
from resdecay.models.mae import choose_skip_sources, fill_and_unshuffle
from resdecay.train.config import load_config

# the tiny MAE on digits-sized images, deeper (6 blocks, a 4-block decoder) for the skip and depth tests
SMALL = dict(DIGITS_IMAGE, depth=6, decoder_depth=4)


def count(model, trainable=False):
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)


def test_mae_b16_parameter_count_equals_authors():
    cfg = load_config("mae-b16").model
    assert cfg.alpha_min == 0.6 and cfg.skips
    with torch.device("meta"):
        model = build_model(cfg)
    assert count(model) == 117_291_008  # authors' 117.29 M incl. the two fixed sin-cos tables
    assert count(model, trainable=True) == 117_038_848  # 117.04 M trainable
    assert sum(p.numel() for p in model.skip_fusions.parameters()) == 6 * (1280 * 512 + 512 + 512 * 512 + 512 + 768)


def test_plain_mae_b16_is_the_standard_mae():
    with torch.device("meta"):
        model = build_model(load_config("mae-b16-plain").model)
    # facebookresearch/mae mae_vit_base_patch16_dec512d8b: 111.91 M parameters incl. pos tables
    assert count(model) == 111_907_840
    assert not hasattr(model, "skip_fusions") and isinstance(model.norm, torch.nn.LayerNorm)


@pytest.mark.parametrize("depth,decoder_depth,expected", [
    (12, 8, [11, 9, 7, 5, 3, 1]),  # the authors' wiring
    (18, 8, [17, 14, 11, 8, 5, 2]),
    (24, 8, [23, 20, 17, 14, 11, 8, 5, 2]),  # ViT-L: the authors' code breaks here
    (12, 4, [11, 8, 5, 2]),
    (1, 1, [0]),
])
def test_skip_wiring(depth, decoder_depth, expected):
    src = choose_skip_sources(depth, decoder_depth)
    assert src == expected
    assert src[0] == depth - 1 and len(src) <= decoder_depth
    cfg = tiny_config("mae", **{**SMALL, "depth": depth, "num_heads": 2, "decoder_depth": decoder_depth})
    model = MaskedAutoencoder(cfg)
    assert model.skip_sources == expected and len(model.skip_fusions) == len(expected)


def test_skip_wiring_feeds_deepest_first(monkeypatch):
    """Decoder block j fuses the output of encoder block skip_sources[j]."""
    torch.manual_seed(0)
    model = MaskedAutoencoder(tiny_config("mae", **SMALL))
    seen = []
    for j, fusion in enumerate(model.skip_fusions):
        fusion.register_forward_hook(lambda m, args, out, j=j: seen.append((j, args[1])))
    outputs = {}
    for i, blk in enumerate(model.blocks):
        blk.register_forward_hook(lambda m, args, out, i=i: outputs.__setitem__(i, out))
    model(torch.randn(2, 1, 8, 8))
    assert [j for j, _ in seen] == list(range(len(model.skip_sources)))
    for j, enc in seen:
        assert enc is outputs[model.skip_sources[j]]


def test_skip_sources_override_and_errors():
    assert choose_skip_sources(12, 8, [11, 7]) == [11, 7]
    for bad in ([12], [-1], [3, 3], list(range(9))):
        with pytest.raises(ValueError, match="skip_sources"):
            choose_skip_sources(12, 8, bad)


def test_masking_and_unshuffle_round_trip():
    torch.manual_seed(0)
    model = MaskedAutoencoder(tiny_config("mae", **SMALL))
    B, N, D = 3, 16, 5
    x = torch.randn(B, N, D)
    kept, mask, ids_restore = model.random_masking(x, 0.75)
    assert kept.shape == (B, 4, D) and torch.all(mask.sum(1) == 12)
    # put the kept tokens back with a marker for removed ones: visible places hold the originals
    with_cls = torch.cat([torch.zeros(B, 1, D), kept], 1)
    marker = torch.full((1, 1, D), 99.0)
    restored = fill_and_unshuffle(with_cls, ids_restore, marker)[:, 1:]
    vis = mask == 0
    assert torch.equal(restored[vis], x[vis])
    assert torch.all(restored[~vis] == 99.0)


def test_patchify_round_trip():
    model = MaskedAutoencoder(tiny_config("mae", **{**SMALL, "in_chans": 3, "img_size": 8, "patch_size": 4}))
    imgs = torch.randn(2, 3, 8, 8)
    p = model.patchify(imgs)
    assert p.shape == (2, 4, 48)
    assert torch.equal(model.unpatchify(p), imgs)
    assert torch.equal(p[0, 1].reshape(4, 4, 3)[..., 0], imgs[0, 0, :4, 4:8])  # patch 1 = top-right


def test_zero_init_unet_starts_at_target_variance_and_learns_everything():
    torch.manual_seed(0)
    model = MaskedAutoencoder(tiny_config("mae", **SMALL))
    imgs = torch.randn(8, 1, 8, 8)
    loss, pred, mask = model(imgs)
    assert torch.all(pred == 0)  # zero-init pixel head
    assert loss.item() == pytest.approx(0.75, abs=0.1)  # norm-pix targets: mean square (n-1)/n = 0.75 for 4 pixels
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):  # zero-init means only the head moves first; after a few steps all do
        opt.zero_grad()
        model(imgs)[0].backward()
        opt.step()
    opt.zero_grad()
    model(imgs)[0].backward()
    dead = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
    assert dead == []
    assert not model.pos_embed.requires_grad and not model.decoder_pos_embed.requires_grad


def test_encoder_alphas_follow_schedule_and_decoder_is_plain():
    model = MaskedAutoencoder(tiny_config("mae", **{**SMALL, "alpha_min": 0.7}))
    got = torch.tensor([[b.alpha_attn, b.alpha_mlp] for b in model.blocks], dtype=torch.float64)
    assert torch.equal(got, model.alphas)
    assert model.blocks[-1].alpha_mlp == 0.7 and model.blocks[0].alpha_attn == 1.0
    assert all(b.alpha_attn == 1.0 and b.alpha_mlp == 1.0 for b in model.decoder_blocks)
    assert model.alpha_eff == pytest.approx(float(model.alphas.prod()))


def test_forward_intermediates_are_unmasked_block_outputs():
    torch.manual_seed(0)
    model = MaskedAutoencoder(tiny_config("mae", **{**SMALL, "zero_init": False}))
    imgs = torch.randn(2, 1, 8, 8)
    outs = model.forward_intermediates(imgs, [0, -1])
    assert [o.shape for o in outs] == [(2, 17, 32)] * 2
    x = model.patch_embed(imgs) + model.pos_embed[:, 1:]
    x = torch.cat([(model.cls_token + model.pos_embed[:, :1]).expand(2, -1, -1), x], 1)
    for blk in model.blocks:
        x = blk(x)
    assert torch.allclose(outs[1], x, atol=1e-6)
    assert torch.allclose(model.forward_features(imgs), x, atol=1e-6)
    with pytest.raises(IndexError):
        model.forward_intermediates(imgs, [6])


def test_plain_mae_loss_and_grads():
    torch.manual_seed(0)
    model = MaskedAutoencoder(tiny_config("mae", **{**SMALL, "alpha_min": 1.0, "skips": False, "zero_init": False, "encoder_norm": True}))
    loss, pred, mask = model(torch.randn(4, 1, 8, 8))
    loss.backward()
    dead = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert dead == [] and torch.isfinite(loss)


def test_flops_count_is_positive_and_grows_with_depth():
    a = MaskedAutoencoder(tiny_config("mae", **SMALL)).flops_per_sample()
    b = MaskedAutoencoder(tiny_config("mae", **{**SMALL, "depth": 12})).flops_per_sample()
    assert 0 < a < b
