"""FID: float64 stats, batch-size independence, the cached proxy extractor, offline Inception, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from helpers import seed_proxy_cache
from resdecay.commands.fid import run_fid
from resdecay.errors import UserError
from resdecay.eval.fid import (
    compute_fid,
    feature_stats,
    fid,
    inception_extractor,
    load_stats,
    proxy_extractor,
    reference_images,
    save_stats,
)
from resdecay.eval.fid import proxy as fidproxy
from resdecay.eval.fid import published as fid_published
from resdecay.eval.fid import stats as fidmod
from resdecay.io import file_sha256


def tiny_extractor(in_chans: int = 1, dim: int = 8) -> nn.Module:
    """A random extractor, for tests where what the features mean does not matter."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(in_chans, dim, 3), nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten())


@pytest.fixture(scope="module")
def proxy_cache(tmp_path_factory, digits_proxy):
    cache = seed_proxy_cache(digits_proxy, tmp_path_factory.mktemp("fid-cache"))  # the session's, trained once
    return proxy_extractor("digits", cache_dir=cache), cache


@pytest.fixture(scope="module")
def digits():
    return reference_images("digits", "train")  # uint8 (1437, 1, 8, 8)


def test_identical_sets_give_zero():
    x = torch.rand(200, 1, 8, 8)
    ext = tiny_extractor()
    st = feature_stats(x, ext)
    assert abs(fid(st, st)) < 1e-6
    res = compute_fid(x, st, ext)  # the same images extracted again
    assert abs(res["value"]) < 1e-6 and res["label"] == "proxy FID (Sequential)"
    assert st["mu"].dtype == st["sigma"].dtype == torch.float64 and st["sigma"].shape == (8, 8)


def test_proxy_real_halves_small_noise_large(proxy_cache, digits):
    ext, _ = proxy_cache
    half = len(digits) // 2
    ref = feature_stats(digits[:half], ext)
    real = compute_fid(digits[half:], ref, ext)
    noise = compute_fid(torch.rand(len(digits) - half, 1, 8, 8), ref, ext)
    assert 0 < real["value"] < 5 and noise["value"] > 10 * real["value"], (real["value"], noise["value"])
    assert real["label"] == "proxy FID (proxy-cnn-digits-8px)" and real["summary"].startswith(real["label"])
    card = real["protocol"]
    assert card["n_samples"] == len(digits) - half and card["n_ref"] == half and card["resolution"] == "8x8x1"
    assert card["stats_dtype"] == "float64" and card["feature_dim"] == 128 and card["batch_size"] == 100
    assert ext.meta["test_acc"] > 0.9


def test_batch_size_and_chunking_do_not_change_fid(proxy_cache, digits):
    ext, _ = proxy_cache
    ref = feature_stats(digits[:700], ext)
    a = fid(feature_stats(digits[700:], ext, batch_size=100), ref)
    b = fid(feature_stats(digits[700:], ext, batch_size=7), ref)
    assert a == pytest.approx(b, rel=1e-6)
    # how the caller chunks the images (a loader of (images, labels), uneven pieces) does not matter at all
    x = digits[700:].float() / 255
    whole = feature_stats(x, ext)
    pieces = feature_stats([(x[:13], None), (x[13:250], None), (x[250:], None)], ext)
    assert torch.equal(whole["mu"], pieces["mu"]) and torch.equal(whole["sigma"], pieces["sigma"])


def test_npz_uint8_nhwc_matches_float_tensor(tmp_path, digits):
    ext = tiny_extractor()
    path = tmp_path / "samples.npz"
    np.savez(path, arr_0=digits[:300].permute(0, 2, 3, 1).numpy())  # ADM layout: uint8 NHWC in arr_0
    from_file = feature_stats(str(path), ext)
    from_tensor = feature_stats(digits[:300].float() / 255, ext)
    assert torch.equal(from_file["mu"], from_tensor["mu"]) and torch.equal(from_file["sigma"], from_tensor["sigma"])


def test_stats_save_load_round_trip(tmp_path):
    x = torch.rand(100, 1, 8, 8)
    ext = tiny_extractor()
    st = feature_stats(x, ext, batch_size=30)
    save_stats(tmp_path / "ref.pt", st)
    back = load_stats(tmp_path / "ref.pt")
    assert torch.equal(back["mu"], st["mu"]) and torch.equal(back["sigma"], st["sigma"])
    assert {k: v for k, v in back.items() if k not in ("mu", "sigma")} == {k: v for k, v in st.items()
                                                                           if k not in ("mu", "sigma")}
    assert abs(compute_fid(x, str(tmp_path / "ref.pt"), ext)["value"]) < 1e-6
    (tmp_path / "bad.pt").write_bytes(b"not a stats file")
    with pytest.raises(UserError, match="cannot read FID reference stats"):
        load_stats(tmp_path / "bad.pt")
    torch.save({"mu": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(UserError, match="not a FID stats file"):
        load_stats(tmp_path / "other.pt")
    with pytest.raises(UserError, match="not found"):
        load_stats(tmp_path / "missing.pt")


def test_proxy_is_cached_not_retrained(proxy_cache, monkeypatch):
    ext, cache = proxy_cache
    (path,) = cache.glob("proxy-cnn-digits-8px-*.pt")
    mtime = path.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("the cached proxy extractor was retrained")

    monkeypatch.setattr(fidproxy, "_train_proxy", no_training)
    again = proxy_extractor("digits", cache_dir=cache)
    assert path.stat().st_mtime_ns == mtime and again.fingerprint == ext.fingerprint
    assert again.name == "proxy-cnn-digits-8px" and again.label == "proxy FID (proxy-cnn-digits-8px)"
    x = torch.rand(4, 1, 8, 8)
    assert torch.equal(again(x), ext(x))


def test_inception_weights_missing_or_unreadable(tmp_path):
    for path in (None, tmp_path / "nope.pth"):
        with pytest.raises(UserError, match="--inception-weights"):
            inception_extractor(path)
    garbage = tmp_path / "pt_inception-2015-12-05-6726825d.pth"
    garbage.write_bytes(b"\x00garbage" * 100)
    with pytest.raises(UserError, match="cannot load Inception weights.*--inception-weights"):
        inception_extractor(garbage)
    torch.save({"fc.weight": torch.zeros(2, 2)}, tmp_path / "wrong.pth")  # readable, but not Inception
    with pytest.raises(UserError, match="--inception-weights"):
        inception_extractor(tmp_path / "wrong.pth")


def test_inception_path_offline_with_random_weights(tmp_path):
    """The real pipeline (uint8 conversion, gray->RGB, torch-fidelity resize) on random weights
    with torch-fidelity's key names (torchvision's Inception3 with 1008 classes has the same)."""
    from torchvision.models import inception_v3

    net = inception_v3(weights=None, aux_logits=False, num_classes=1008, init_weights=False)
    torch.save(net.state_dict(), tmp_path / "weights.pth")
    ext = inception_extractor(tmp_path / "weights.pth")
    st = feature_stats(torch.rand(4, 1, 8, 8), ext, batch_size=2)
    assert st["mu"].shape == (2048,) and st["grayscale_to_rgb"] and st["resolution"] == (1, 8, 8)
    assert st["label"].startswith("Inception-v3 Frechet distance, NOT FID") and "-6726825d.pth" in st["label"]  # random weights
    assert st["resize_filter"] == "bilinear (torch-fidelity, 299x299)"
    with pytest.raises(UserError, match="need at least 2049"):
        fid(st, st)


def test_resolution_and_extractor_mismatch(proxy_cache):
    ref = feature_stats(torch.rand(50, 1, 8, 8), tiny_extractor())
    with pytest.raises(UserError, match=r"reference stats are for 8x8x1 images, samples are 16x16x3: rebuild"):
        compute_fid(torch.rand(50, 3, 16, 16), ref, tiny_extractor())  # stops before the (1-channel) extractor runs
    with pytest.raises(UserError, match="built with extractor Sequential, the samples with proxy-cnn-digits-8px@"):
        compute_fid(torch.rand(200, 1, 8, 8), ref, proxy_cache[0])
    with pytest.raises(UserError, match="was trained on 8x8x1 images, these are 16x16x1"):
        feature_stats(torch.rand(10, 1, 16, 16), proxy_cache[0])


def test_too_few_samples():
    ext = tiny_extractor(dim=8)
    ref = feature_stats(torch.rand(50, 1, 8, 8), ext)
    with pytest.raises(UserError, match=r"samples have 5 images but 8-dimensional features need at least 9 .*rank-deficient"):
        compute_fid(torch.rand(5, 1, 8, 8), ref, ext)
    assert compute_fid(torch.rand(5, 1, 8, 8), ref, ext, allow_few=True)["value"] > 0
    with pytest.raises(UserError, match="at least 2 images, got 1"):
        feature_stats(torch.rand(1, 1, 8, 8), ext)


def test_unrecognised_samples(tmp_path):
    ext = tiny_extractor()
    bad = [(np.random.rand(4, 8, 8, 1), "uint8 NHWC"), (42, "not images"), (torch.rand(4, 8, 8), "1 or 3 channels"),
           ((torch.rand(4, 1, 8, 8) - 0.5) / 0.3, r"floats in \[0, 1\]"), (str(tmp_path / "x.npz"), "cannot read samples")]
    for samples, msg in bad:
        with pytest.raises(UserError, match=msg):
            feature_stats(samples, ext)
    with pytest.raises(UserError, match="proxy FID needs a labelled fixed-size dataset"):
        proxy_extractor("imagefolder", cache_dir=tmp_path)


def test_extractors_are_described_by_a_typed_card(proxy_cache):
    """Issue 21.3: what FID statistics record about an extractor comes from one typed card
    (``FeatureExtractor.card``); any other module is an anonymous extractor named after its class."""
    from resdecay.eval.fid import ExtractorCard, FeatureExtractor, extractor_card, feature_stats_id

    ext = proxy_cache[0]
    card = extractor_card(ext)
    assert isinstance(ext, FeatureExtractor) and card.kind == "proxy" and card.resolution == (1, 8, 8)
    assert card.id == f"proxy-cnn-digits-8px@{ext.fingerprint}" == feature_stats_id(ext)
    plain = extractor_card(tiny_extractor())
    assert (plain.name, plain.label, plain.fingerprint, plain.needs_rgb) == ("Sequential", "proxy FID (Sequential)", None, False)

    class Doubled(FeatureExtractor):  # a user's own extractor: its card is what the stats record
        def __init__(self):
            super().__init__()
            self.inner = tiny_extractor()
            self.card = ExtractorCard(name="doubled", label="FID (doubled)", resize_filter="nearest", needs_rgb=True,
                                      fingerprint="abc")

        def forward(self, x):
            return 2 * self.inner(x)

    st = feature_stats(torch.rand(20, 1, 8, 8), Doubled())
    assert (st["extractor_id"], st["label"], st["resize_filter"], st["grayscale_to_rgb"]) == ("doubled@abc", "FID (doubled)",
                                                                                                "nearest", True)


# ----------------------------------------------------------------------------- issue 30.10: published weights and statistics
def random_inception_weights(path):
    """FID Inception-v3's layout with random weights (the published file is not shipped, nor downloaded)."""
    from torchvision.models import inception_v3

    torch.manual_seed(0)
    torch.save(inception_v3(weights=None, aux_logits=False, num_classes=1008, init_weights=False).state_dict(), path)
    return path


def image_npz(path, n, seed, **extra):
    np.savez(path, arr_0=np.random.default_rng(seed).integers(0, 256, (n, 8, 8, 3), dtype=np.uint8), **extra)
    return path


@pytest.mark.slow
def test_pytorch_fid_and_adm_statistics_are_accepted_as_the_reference(tmp_path, monkeypatch):
    """pytorch-fid's --save-stats .npz (mu, sigma) and ADM's reference batch (arr_0 with mu, sigma) were refused
    as --ref; now they are the reference, and give the FID the same reference images give."""
    weights = random_inception_weights(tmp_path / "weights.pth")
    published = file_sha256(weights)[:8]  # stand in for the published file, whose digest is recognised
    for module in (fid_published, fidmod):
        monkeypatch.setattr(module, "PUBLISHED_INCEPTION", published)
    samples, ref_images = image_npz(tmp_path / "samples.npz", 4, 0), image_npz(tmp_path / "ref.npz", 5, 1)
    settings = dict(inception_weights=str(weights), allow_few=True, progress=False, batch_size=8, device="cpu")
    expected = run_fid(str(samples), ref=str(ref_images), **settings)
    assert expected["label"] == "FID (Inception-v3, torchmetrics)" and expected["protocol"]["published_fid_weights"]
    st = feature_stats(str(ref_images), inception_extractor(weights), batch_size=8)
    pytorch_fid = tmp_path / "pytorch_fid_stats.npz"
    np.savez(pytorch_fid, mu=st["mu"].numpy(), sigma=st["sigma"].numpy())  # pytorch-fid's layout, float64
    adm = image_npz(tmp_path / "VIRTUAL_ref.npz", 5, 1, mu=st["mu"].numpy().astype(np.float32),
                    sigma=st["sigma"].numpy(), mu_s=np.zeros(3), sigma_s=np.eye(3))
    for ref in (pytorch_fid, adm):
        got = run_fid(str(samples), ref=str(ref), **settings)
        assert got["value"] == pytest.approx(expected["value"], rel=1e-4), ref.name
        assert got["label"] == "FID (Inception-v3, torchmetrics)" and got["protocol"]["reference_kind"] == "stats"
        assert got["protocol"]["n_ref"] is None and "pytorch-fid / ADM statistics" in got["summary"]
    np.savez(tmp_path / "bad.npz", mu=np.zeros(3), sigma=np.zeros(4))
    with pytest.raises(UserError, match="are not a mean vector and its covariance"):
        run_fid(str(samples), ref=str(tmp_path / "bad.npz"), **settings)


@pytest.mark.slow
def test_inception_weights_that_are_not_the_published_file_are_not_called_fid(tmp_path):
    """The weights' digest was recorded but never compared: any Inception-shaped file gave "FID"."""
    weights = random_inception_weights(tmp_path / "pt_inception-2015-12-05-6726825d.pth")  # the name does not make it so
    samples, ref_images = image_npz(tmp_path / "samples.npz", 4, 0), image_npz(tmp_path / "ref.npz", 5, 1)
    result = run_fid(str(samples), ref=str(ref_images), inception_weights=str(weights), allow_few=True, progress=False,
                     batch_size=8, device="cpu")
    assert result["label"].startswith("Inception-v3 Frechet distance, NOT FID") and not result["summary"].startswith("FID")
    assert result["protocol"]["published_fid_weights"] is False
    np.savez(tmp_path / "stats.npz", mu=np.zeros(2048), sigma=np.eye(2048))
    with pytest.raises(UserError, match="made with the published FID Inception weights.*sha256 starts 6726825d.*--inception-weights"):
        run_fid(str(samples), ref=str(tmp_path / "stats.npz"), inception_weights=str(weights), allow_few=True,
                progress=False, batch_size=8, device="cpu")


def test_the_proxy_id_does_not_depend_on_how_long_its_training_took(tmp_path, monkeypatch):
    """Issue 30.12: the proxy's id hashed its cache file, which records the training's wall-clock seconds,
    so the same training on a busy machine got another id and refused statistics made on a quiet one."""
    def same_training(*args, **kwargs):  # the same weights each time, as a seeded training gives
        torch.manual_seed(0)
        return fidproxy.ProxyCNN(1, 10).eval()

    monkeypatch.setattr(fidproxy, "_train_proxy", same_training)
    ids = []
    for seconds in (1.0, 9.0):  # a quiet and a loaded machine
        clock = iter([100.0, 100.0 + seconds])
        monkeypatch.setattr(fidproxy.time, "perf_counter", lambda clock=clock: next(clock))
        ext = proxy_extractor("digits", cache_dir=tmp_path / f"cache{seconds:g}")
        assert ext.meta["train_seconds"] == seconds
        ids.append(ext.card.id)
    assert ids[0] == ids[1]
