"""Hyper-connections (``nn.hyper``, ``model.hyper_streams`` / ``model.hyper_variant``) on resdecay's own families:
one stream is the plain model exactly, the package's modules with one stream reproduce our blocks' adds bit for
bit (decay included), the decay scales the carried streams, n = 2 / 4 and mHC train, count and round-trip, and
bad settings are one line each."""

from __future__ import annotations

import io
import sys

import pytest
import torch

from resdecay.errors import ConfigError, UserError
from resdecay.eval.diagnostics import diagnose
from resdecay.models import build_model, get_family, tiny_config
from resdecay.nn.hyper import HyperStreams, hyper_summary
from resdecay.schedule import effective_decay

FAMILIES = ("mae", "sit", "uvit")


def _model(family: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = tiny_config(family)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return build_model(cfg).eval()


def _live_branches(model) -> None:
    """Give every branch a non-zero output (zero-init / adaLN-Zero would hide a wrong branch)."""
    g = torch.Generator().manual_seed(1)
    for name, p in model.named_parameters():
        if name.startswith("blocks.") and p.ndim == 2:
            p.data.copy_(torch.randn(p.shape, generator=g) * 0.2)


def _features(model, batch):
    with torch.no_grad():
        return model.forward_intermediates(batch.images, *batch.conditioning, indices=[0, -1])


@pytest.mark.parametrize("family", FAMILIES)
def test_one_stream_is_the_plain_model_exactly(family):
    plain = _model(family)  # the config as it was before hyper-connections existed
    one = _model(family, hyper_streams=1, hyper_variant="mhc")
    assert one.hyper is None and list(one.state_dict()) == list(plain.state_dict())
    assert not any("hyper" in k for k in one.state_dict())
    for a, b in zip(plain.state_dict().values(), one.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    batch = get_family(family).example_batch(plain, 3)
    torch.manual_seed(5)
    out_plain = get_family(family).objective(plain.train(), batch.images, batch.labels)
    torch.manual_seed(5)
    out_one = get_family(family).objective(one.train(), batch.images, batch.labels)
    assert torch.equal(out_plain, out_one)
    assert one.flops_per_sample() == plain.flops_per_sample()


@pytest.mark.parametrize("gain", ["none", "layerscale"])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_packages_one_stream_connection_reproduces_the_blocks_adds_bit_for_bit(family, gain):
    # HyperConnections with one stream, not disabled, starts as x + f(x): run through it, the blocks' branch functions
    # (a branch gain included) and the decay hook (alpha_min < 1) must give the blocks' own residual_add outputs exactly
    extra = {"branch_scale": gain, "layerscale_init": 0.5}
    model = _model(family, alpha_min=0.6, zero_init=False, **extra) if family != "sit" else _model(family, alpha_min=0.6, **extra)
    _live_branches(model)
    batch = get_family(family).example_batch(model, 3)
    plain = _features(model, batch)
    model.hyper = HyperStreams(model.blocks, model.cfg.embed_dim, 1, "hc", tokens=1)
    through = _features(model, batch)
    assert not torch.equal(plain[0], plain[1])
    for a, b in zip(plain, through, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("streams", [2, 4])
def test_the_decay_scales_the_carried_streams(streams):
    # zero-initialised branches add nothing and HC's stream mixing starts as the identity, so every block maps
    # the streams H -> alpha_attn * alpha_mlp * H: the last block's summed streams are n * alpha_eff * the input
    model = _model("mae", alpha_min=0.6, hyper_streams=streams)
    images = get_family("mae").example_batch(model, 2).images
    with torch.no_grad():
        last = model.forward_features(images)
        expected = streams * effective_decay(model.alphas) * model.embed(images)
    assert torch.allclose(last, expected, rtol=1e-5, atol=1e-7)
    undecayed = _model("mae", alpha_min=1.0, hyper_streams=streams)
    with torch.no_grad():
        assert torch.allclose(undecayed.forward_features(images), streams * undecayed.embed(images), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_decayed_and_undecayed_streams_differ(family):
    decayed, plain = (_model(family, alpha_min=a, hyper_streams=2, zero_init=False) for a in (0.6, 1.0))
    _live_branches(decayed)
    plain.load_state_dict(decayed.state_dict())  # same weights: only alpha differs
    batch = get_family(family).example_batch(decayed, 2)
    a, b = _features(decayed, batch)[1], _features(plain, batch)[1]
    assert a.shape == b.shape and not torch.allclose(a, b, rtol=1e-3)


def _extra_params(streams: int, dim: int, adds: int, variant: str) -> int:
    # per hyper-connection: static alpha n(n+1), dynamic alpha D(n+1) and its scale, static beta n, dynamic beta D
    # and its scale, the RMSNorm's D; mHC has one more scale (the pre-branch and residual scales are separate)
    per_add = streams * (streams + 1) + dim * (streams + 1) + 1 + streams + dim + 1 + dim
    return adds * (per_add + (variant == "mhc"))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("streams, variant", [(2, "hc"), (4, "hc"), (4, "mhc")])
def test_n_streams_build_train_count_and_round_trip(family, streams, variant):
    model = _model(family, hyper_streams=streams, hyper_variant=variant).train()
    plain = _model(family)
    cfg, spec = model.cfg, get_family(family)
    expected = _extra_params(streams, cfg.embed_dim, 2 * cfg.depth, variant)
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in plain.parameters()) == expected
    assert hyper_summary(model)["params"] == expected and hyper_summary(plain) is None
    # every block's keys are the plain model's: the streams add keys under hyper.* only
    assert {k for k in model.state_dict() if not k.startswith("hyper.")} == set(plain.state_dict())
    batch = spec.example_batch(model, 3)
    loss = spec.objective(model, batch.images, batch.labels)
    loss.backward()
    assert torch.isfinite(loss)
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing
    assert all(p.grad is not None for p in model.hyper.parameters())
    feats = _features(model.eval(), batch)
    assert [f.shape for f in feats] == [f.shape for f in _features(plain, batch)]  # reduced: (B, T, D)
    # a checkpoint-like round trip into a model built from another seed
    buf = io.BytesIO()
    torch.save({"model": model.state_dict()}, buf)
    other = _model(family, seed=7, hyper_streams=streams, hyper_variant=variant)
    other.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True)["model"])
    for a, b in zip(feats, _features(other, batch), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("family", FAMILIES)
def test_flops_count_the_streams(family):
    plain, model = _model(family), _model(family, hyper_streams=4)
    extra = model.hyper.flops_per_sample()
    n, d, tokens = 4, model.cfg.embed_dim, model.hyper.tokens
    skips = model.hyper.per_stream_flops * (n - 1)  # U-ViT's skip Linears run once per stream
    assert extra == 2 * model.cfg.depth * 4 * n * d * (n + 2) * tokens + skips
    assert model.flops_per_sample() == pytest.approx(plain.flops_per_sample() + extra, rel=1e-12)
    assert hyper_summary(model)["flops_per_sample"] == extra


def test_grad_checkpointing_keeps_the_gradients():
    grads = []
    for ckpt in (False, True):
        model = _model("mae", hyper_streams=2, zero_init=False).train()
        model.set_grad_checkpointing(ckpt)
        images = get_family("mae").example_batch(model, 2).images
        torch.manual_seed(3)
        model(images)[0].backward()
        grads.append([p.grad.clone() for p in model.hyper.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "2"])
@pytest.mark.parametrize("family", FAMILIES)
def test_bad_stream_counts_are_one_line(family, value):
    cfg = tiny_config(family)
    cfg.hyper_streams = value
    with pytest.raises(ConfigError, match="model.hyper_streams must be an integer >= 1") as e:
        cfg.validate()
    assert "\n" not in str(e.value)


def test_a_dropped_identity_is_refused_with_streams_in_one_line():
    with pytest.raises(ConfigError) as e:
        _model("mae", hyper_streams=2, drop_identity=0.1).cfg.validate()
    assert "\n" not in str(e.value) and "model.drop_identity" in str(e.value)


def test_unknown_variant_update_formula_and_missing_package_are_one_line(monkeypatch):
    cfg = tiny_config("mae")
    cfg.hyper_variant = "mhc2"
    with pytest.raises(ConfigError, match="model.hyper_variant 'mhc2' is unknown; choose one of hc, mhc"):
        cfg.validate()
    cfg = tiny_config("sit")
    cfg.hyper_streams, cfg.shortcut = 2, "orthogonal"
    with pytest.raises(ConfigError, match="defined against one residual stream"):
        cfg.validate()
    cfg.shortcut = "orthogonal_decay"
    cfg.hyper_streams = 1  # one stream: the update is the plain model's, allowed
    cfg.validate()
    monkeypatch.setitem(sys.modules, "hyper_connections", None)  # import fails as if not installed
    cfg = tiny_config("uvit")
    cfg.hyper_streams = 2
    with pytest.raises(ConfigError, match="needs the hyper-connections package: pip install hyper-connections") as e:
        cfg.validate()
    assert "\n" not in str(e.value)
    tiny_config("uvit").validate()  # without streams the package is never imported


def test_the_diagnostics_refuse_streams_in_one_line():
    model = _model("mae", hyper_streams=2)
    with pytest.raises(UserError, match=r"one residual stream, but this model mixes 2 \(model.hyper_streams=2") as e:
        diagnose(model, torch.randn(4, 3, 16, 16), which=("paths",))
    assert "\n" not in str(e.value)


def test_the_stability_monitor_sees_every_block_through_its_streams():
    from resdecay.train.stability import BlockNormMonitor

    model = _model("mae", hyper_streams=2).train()
    monitor = BlockNormMonitor(model)
    monitor.arm()
    model(get_family("mae").example_batch(model, 2).images)
    rms = monitor.read()
    assert rms is not None and len(rms) == model.cfg.depth + model.cfg.decoder_depth
    assert all(r > 0 for r in rms)


def test_the_one_stream_weight_formats_refuse_streams():
    from resdecay.interop.export_timm import spec_of
    from resdecay.interop.hf_vitmae import vitmae_config

    cfg = tiny_config("mae")
    cfg.hyper_streams, cfg.skips, cfg.encoder_norm = 4, False, True
    with pytest.raises(UserError, match="model.hyper_streams=4 \\(hyper-connections\\) has no timm form"):
        spec_of(cfg)
    with pytest.raises(UserError, match="this MAE has model.hyper_streams=4 \\(hyper-connections\\), which ViTMAE cannot"):
        vitmae_config(cfg)


def test_a_runs_label_names_its_streams():
    from resdecay.nn.shortcut_info import describe_model

    cfg = tiny_config("mae")
    plain = describe_model(cfg)
    cfg.hyper_streams, cfg.hyper_variant = 4, "mhc"
    assert describe_model(cfg) == plain + ", mhc x4 streams"
