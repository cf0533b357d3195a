"""Residual-stream diagnostics (``resdecay.eval.diagnostics``) against references: the path
decomposition sums to the stream for every family, the ridge equals scikit-learn's, knocking out a
zero branch changes nothing, and a model decayified with alpha_min = 1 is diagnosed as the original."""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch
import torch.nn as nn

from resdecay import decayify
from resdecay.errors import UserError
from resdecay.eval.diagnostics import diagnose, find_sites, ridge_r2
from resdecay.eval.diagnostics.paths import PathStats
from resdecay.eval.diagnostics.pixels import pixel_targets
from resdecay.models.mae import TINY_MAE, MAEConfig, MaskedAutoencoder
from resdecay.models.sit import SiT, SiTConfig
from resdecay.stream.norms import block_norms
from resdecay.stream.record import Pass, hooked
from resdecay.stream.runner import model_runner


def _jitter(model: nn.Module, scale: float = 0.05) -> nn.Module:
    """Random offsets on every weight: no zero-initialised branch or gate, so that every path counts."""
    g = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.data.add_(scale * torch.randn(p.shape, generator=g))
    return model


def _images(n: int, c: int = 3, s: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, c, s, s, generator=torch.Generator().manual_seed(seed))


def mae(alpha_min=0.6, skips=False, zero_init=False):
    torch.manual_seed(0)
    cfg = MAEConfig(**{**TINY_MAE, "alpha_min": alpha_min, "skips": skips, "zero_init": zero_init,
                       "encoder_norm": not skips})
    return MaskedAutoencoder(cfg).eval(), _images(6), {}


def unet_mae():
    model, x, kw = mae(alpha_min=0.6, skips=True)
    return model, x, kw


def sit():
    torch.manual_seed(0)
    cfg = SiTConfig(img_size=8, in_chans=4, patch_size=2, embed_dim=32, depth=4, num_heads=2, num_classes=10,
                    alpha_min=0.8, skips=True)
    return _jitter(SiT(cfg).eval()), _images(6, c=4, s=8), {"conditioning": (0.3, 7)}


def timm_vit(alpha_min=0.6):
    import timm
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=3,
                              num_classes=0).eval()
    if alpha_min is not None:
        decayify(model, alpha_min=alpha_min)
    return model, _images(6, s=32), {}


def hf_vitmae(alpha_min=0.6):
    from transformers import ViTMAEConfig, ViTMAEForPreTraining
    torch.manual_seed(0)
    cfg = ViTMAEConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=8, decoder_hidden_size=32, decoder_num_hidden_layers=1,
                       decoder_num_attention_heads=2, decoder_intermediate_size=64)
    model = ViTMAEForPreTraining(cfg).eval()
    if alpha_min is not None:
        decayify(model, alpha_min=alpha_min)
    return model, _images(6, s=32), {}


def diffusers_dit():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from diffusers import DiTTransformer2DModel
        torch.manual_seed(0)
        model = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2,
                                      sample_size=8, patch_size=2, num_embeds_ada_norm=10).eval()
    decayify(_jitter(model), alpha_min=0.6)
    return model, _images(6, c=4, s=8), {"conditioning": (3, 1)}


FAMILIES = {"mae": mae, "unet_mae": unet_mae, "sit": sit, "timm_vit": timm_vit, "hf_vitmae": hf_vitmae,
            "diffusers_dit": diffusers_dit}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_paths_sum_to_the_stream(family, dtype):
    model, x, kw = FAMILIES[family]()
    model, x = model.to(dtype), x.to(dtype)
    report = diagnose(model, x, which=("paths",), batch_size=4, **kw)
    paths = report["paths"]
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert max(paths["reconstruction_error"]) <= tol, paths["reconstruction_error"]
    assert any(a < 1 for row in report["alphas"] for a in row)  # a decayed model: the alphas matter
    for row in paths["projection"] + paths["projection_centred"]:  # projections sum to 1; energies need not
        assert sum(row) == pytest.approx(1.0, abs=10 * tol)
    assert json.loads(json.dumps(report)) == report


def test_sit_long_skips_are_parts_between_blocks():
    model, x, kw = sit()
    paths = diagnose(model, x, which=("paths",), **kw)["paths"]
    between = [k for k, name in enumerate(paths["parts"]) if name.startswith("between:")]
    assert max(abs(paths["projection"][-1][k]) for k in between) > 1e-3  # SiT's skips add to the stream
    plain = diagnose(*timm_vit()[:2], which=("paths",))["paths"]
    assert all(plain["energy"][-1][k] == 0 for k, n in enumerate(plain["parts"]) if n.startswith("between:"))


def test_a_wrong_alpha_shows_as_a_reconstruction_error():
    """The decomposition is a check, not an identity: branches are read from the branch modules, so an
    alpha other than the one the forward used does not telescope away."""
    model, x, _ = timm_vit()
    sites = find_sites(model)
    sites[1].subs[0].alpha += 0.1
    stats, rec = PathStats(sites), Pass()
    with torch.no_grad(), model_runner(model) as run, hooked(sites, rec):
        run(x)
    stats.update(rec)
    assert stats.summary()["reconstruction_error"][-1] > 1e-3


def test_zero_branches_leave_only_the_direct_path():
    model, x, _ = mae(zero_init=True)  # every branch zero: stream_L = (prod alpha) x_0
    paths = diagnose(model, x, which=("paths",))["paths"]
    assert paths["direct_projection"] == pytest.approx([1.0] * 4, abs=1e-6)
    assert paths["direct_energy_centred"] == pytest.approx([1.0] * 4, abs=1e-6)


def test_ridge_equals_scikit_learn():
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(300, 12, generator=g, dtype=torch.float64) * 3 + 1, torch.randn(12, 7, generator=g, dtype=torch.float64)
    y = x @ w + 0.5 * torch.randn(300, 7, generator=g, dtype=torch.float64) + 2
    r2, lam = ridge_r2(x[:200], y[:200], x[200:], y[200:], ridge=0.05)
    fit = Ridge(alpha=lam, fit_intercept=True).fit(x[:200].numpy(), y[:200].numpy())
    want = r2_score(y[200:].numpy(), fit.predict(x[200:].numpy()), multioutput="variance_weighted")
    assert r2 == pytest.approx(want, abs=1e-6)
    assert 0.3 < r2 < 1


def test_pixel_r2_equals_scikit_learn_on_the_tokens():
    """diagnose's per-layer R^2 from its running sums = scikit-learn on the same tokens and targets."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score
    model, _, _ = mae()
    train, test = _images(8, seed=2), _images(6, seed=3)
    pix = diagnose(model, test, train_images=train, which=("pixels",), batch_size=3)["pixels"]
    assert pix["train_tokens"] == 8 * 16 and pix["test_tokens"] == 6 * 16 and pix["sigma"] == 1.0
    with torch.no_grad():
        feats = [model.forward_intermediates(s, [0, 3]) for s in (train, test)]
    for layer, k in ((1, 0), (4, 1)):
        xs = [f[k][:, 1:].reshape(-1, 32).double().numpy() for f in feats]
        for key, cols in (("r2_pixels", slice(0, 48)), ("r2_high_freq", slice(48, None))):
            ys = [torch.cat(pixel_targets(s, (4, 4), 1.0), -1)[..., cols].reshape(-1, 48).double().numpy()
                  for s in (train, test)]
            fit = Ridge(alpha=pix["lambda"][layer], fit_intercept=True).fit(xs[0], ys[0])
            want = r2_score(ys[1], fit.predict(xs[1]), multioutput="variance_weighted")
            assert pix[key][layer] == pytest.approx(want, abs=1e-6)


def test_branch_norms_are_the_profile_s():
    model, x, _ = mae()
    branches = diagnose(model, x, which=("branches",), batch_size=6)["branches"]
    for i, row in enumerate(block_norms(model, x)):
        for j, sub in enumerate(("attn", "mlp")):
            k = 2 * i + j
            assert branches["shortcut_norm"][k] == pytest.approx(row[f"shortcut_{sub}"], rel=1e-5)
            assert branches["branch_norm"][k] == pytest.approx(row[f"branch_{sub}"], rel=1e-5)
            assert -1 <= branches["cosine"][k] <= 1


def test_knockout_equals_a_model_without_the_branch():
    model, x, _ = mae()
    knock = diagnose(model, x, which=("knockout",), batch_size=4)["knockout"]
    for layer in (0, 2):
        cut = copy.deepcopy(model)
        cut.blocks[layer].zero_init_branches()
        with torch.no_grad():
            z, z2 = model.forward_features(x), cut.forward_features(x)
        assert knock["change_tokens"][layer] == pytest.approx(float((z2 - z).norm() / z.norm()), rel=1e-4)
        assert knock["change_pooled"][layer] == pytest.approx(
            float((z2.mean(1) - z.mean(1)).norm() / z.mean(1).norm()), rel=1e-4)


def test_knocking_out_a_zero_branch_changes_nothing():
    model, x, _ = mae()
    model.blocks[2].zero_init_branches()  # block 2's branches are exactly zero
    y = torch.arange(6) % 2
    knock = diagnose(model, x, train_images=_images(8, seed=4), labels=y, train_labels=torch.arange(8) % 2,
                     which=("knockout",), knn_k=3)["knockout"]
    assert knock["change_tokens"][2] == 0.0 and knock["change_pooled"][2] == 0.0
    assert knock["knn_top1"][2] == knock["knn_top1_intact"]
    assert min(knock["change_tokens"][k] for k in (0, 1, 3)) > 1e-4
    capped = diagnose(model, x, which=("knockout",), knockout_images=4, batch_size=4)["knockout"]
    assert capped["images"] == 4 and capped["change_tokens"][2] == 0.0
    sub = diagnose(model, x, which=("knockout",), knockout="sub_block")["knockout"]
    assert len(sub["removed"]) == 8 and sub["change_tokens"][4:6] == [0.0, 0.0]


@pytest.mark.parametrize("family", ["timm_vit", "hf_vitmae"])
def test_alpha_min_one_is_diagnosed_as_the_original(family):
    plain, x, kw = FAMILIES[family](alpha_min=None)
    decayed = decayify(copy.deepcopy(plain), alpha_min=1.0)
    train, y, ty = _images(8, s=32, seed=5), torch.arange(6) % 2, torch.arange(8) % 2
    args = dict(train_images=train, labels=y, train_labels=ty, knn_k=3, batch_size=4, **kw)
    assert diagnose(decayed, x, **args) == diagnose(plain, x, **args)


def test_hf_vitmae_is_read_unmasked_and_in_order():
    model, x, _ = hf_vitmae()
    report = diagnose(model, x, which=("paths",))
    assert report["tokens"] == 1 + 16  # cls and every patch: no random masking
    assert report["blocks"] == ["vit.layers.0", "vit.layers.1", "vit.layers.2"]  # the decoder's blocks are another stream
    assert model.config.mask_ratio == 0.75  # restored


def test_models_without_reachable_blocks_are_refused_in_one_line():
    with pytest.raises(UserError) as e:
        diagnose(nn.Sequential(nn.Conv2d(3, 4, 3)), _images(2))
    assert "\n" not in str(e.value) and "no residual block" in str(e.value)
    from resdecay.nn.adapters import BlockAdapter, register_adapter, unregister_adapter
    register_adapter(BlockAdapter("an adapter that states no roles", (Residual,), 1, install=lambda b, a, c: None,
                                  factors=lambda b: ((1.0,), (1.0,)), zero_init=lambda b: None))
    try:
        with pytest.raises(UserError) as e:
            diagnose(nn.Sequential(Residual(), Residual()), torch.zeros(2, 3, 4))
    finally:
        unregister_adapter("an adapter that states no roles")
    assert "\n" not in str(e.value) and "states no roles" in str(e.value)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Linear(4, 4)

    def forward(self, x):
        return x + self.f(x)


def test_datasets_give_images_and_labels():
    from torch.utils.data import TensorDataset
    model, x, _ = mae()
    test, train = TensorDataset(x, torch.arange(6) % 2), TensorDataset(_images(8, seed=4), torch.arange(8) % 2)
    report = diagnose(model, test, train_images=train, which=("knockout",), knn_k=3, batch_size=4)
    assert report["images"] == 6 and report["train_images"] == 8 and len(report["knockout"]["knn_top1"]) == 4


def test_a_patch_size_that_does_not_fit_the_tokens_is_refused():
    model, x, _ = mae()
    with pytest.raises(UserError, match="pass the model's patch_size"):
        diagnose(model, x, which=("pixels",), patch_size=2)  # 64 patches, 17 tokens


def test_an_unknown_option_and_a_branch_end_that_never_runs_are_one_line_each():
    model, x, _ = mae()
    with pytest.raises(UserError) as e:
        diagnose(model, x, knock_out="block")  # a misspelt DiagnoseOptions field
    assert "\n" not in str(e.value) and "knock_out" in str(e.value) and "knockout" in str(e.value)
    from resdecay.nn.adapters import BlockAdapter, Role, register_adapter, unregister_adapter
    register_adapter(BlockAdapter("an adapter whose branch end never runs", (Residual,), 1, install=lambda b, a, c: None,
                                  factors=lambda b: ((1.0,), (1.0,)), zero_init=lambda b: None,
                                  reads=lambda b: [Role(b, b.unused)]))
    try:
        with pytest.raises(UserError) as e:
            diagnose(nn.Sequential(UnusedEnd(), UnusedEnd()), torch.zeros(2, 3, 4), which=("paths",))
    finally:
        unregister_adapter("an adapter whose branch end never runs")
    assert "\n" not in str(e.value) and "does not run in the forward" in str(e.value)


class UnusedEnd(Residual):
    def __init__(self):
        super().__init__()
        self.unused = nn.Identity()
