"""Issue 14 (throughput): the cheaper skip fusion is the same function, fused AdamW keeps runs
exact, the uint8 image path matches the old one's errors and determinism. All tiny and fast."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers import DIGITS_IMAGE, tiny_config
from resdecay.models import MaskedAutoencoder, build_model
from resdecay.models.mae import SkipFusion, fill_and_unshuffle
from resdecay.train.config import load_config

# the tiny MAE on digits-sized images, narrower (24 wide, a 16-wide 3-block decoder)
SMALL = dict(DIGITS_IMAGE, embed_dim=24, decoder_embed_dim=16, decoder_depth=3)


def concat_fusion(f: SkipFusion, dec, enc, ids_restore):
    """The formulation before issue 14: fill at encoder width, unshuffle, concatenate, fc1."""
    enc = fill_and_unshuffle(enc, ids_restore, f.mask_token)
    return dec + f.fc2(f.act(f.fc1(torch.cat([enc, dec], dim=-1))))


def _perturb(model):
    with torch.no_grad():  # zero-init makes fc2 silent; give every parameter a value
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))


def test_split_fusion_equals_concat_fusion_outputs_and_grads():
    torch.manual_seed(0)
    model = MaskedAutoencoder(tiny_config("mae", **SMALL)).double()
    _perturb(model)
    ref = copy.deepcopy(model)
    for f in ref.skip_fusions:  # the reference model runs the old formulation
        f.forward = lambda dec, enc, ids, f=f: concat_fusion(f, dec, enc, ids)
    imgs = torch.randn(3, 1, 8, 8, dtype=torch.float64)
    out = []
    for m in (model, ref):
        torch.manual_seed(1)  # same masks
        loss, pred, _ = m(imgs)
        loss.backward()
        out.append((loss, pred, {n: p.grad for n, p in m.named_parameters() if p.grad is not None}))
    (la, pa, ga), (lb, pb, gb) = out
    torch.testing.assert_close(la, lb, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pa, pb, rtol=1e-12, atol=1e-12)
    assert ga.keys() == gb.keys() and any("skip_fusions.0.mask_token" in n for n in ga)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-10, atol=1e-12, msg=n)


def test_split_fusion_float32_and_bf16_autocast_close():
    torch.manual_seed(0)
    f = SkipFusion(24, 16)
    torch.nn.init.normal_(f.fc2.weight, std=0.1)
    B, N, K = 2, 16, 4
    ids = torch.stack([torch.randperm(N) for _ in range(B)])
    enc, dec = torch.randn(B, 1 + K, 24), torch.randn(B, 1 + N, 16)
    torch.testing.assert_close(f(dec, enc, ids), concat_fusion(f, dec, enc, ids), rtol=1e-5, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = f(dec, enc, ids), concat_fusion(f, dec, enc, ids)
    torch.testing.assert_close(a.float(), b.float(), rtol=0.05, atol=0.05)


def test_fusion_state_dict_keys_unchanged_and_flops_follow():
    cfg = load_config("mae-b16").model
    with torch.device("meta"):
        model = build_model(cfg)
    keys = {k for k in model.state_dict() if k.startswith("skip_fusions.0.")}
    assert keys == {f"skip_fusions.0.{k}" for k in ("mask_token", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
    assert tuple(model.skip_fusions[0].fc1.weight.shape) == (512, 768 + 512)
    # 21.69 GFLOP with the concatenating fusion; 6 fusions x 2 x (197 - 50) x 768 x 512 fewer now
    saved = 6 * 2 * (197 - 50) * 768 * 512
    assert abs(model.flops_per_sample() - (21.69e9 - saved)) < 0.01e9
    assert abs(saved / 1e9 - 0.694) < 0.001


def test_background_checkpoint_is_a_snapshot_atomic_and_one_at_a_time(tmp_path, monkeypatch):
    from resdecay.train import checkpoint as ckpt
    from resdecay.train.async_checkpoint import CheckpointWriter

    w = CheckpointWriter()
    weights = torch.zeros(4)
    w.submit({"model": {"w": weights}}, tmp_path, 1, keep_last=2)
    weights.add_(1.0)  # the next optimizer step must not reach the file being written
    w.submit({"model": {"w": weights}}, tmp_path, 2, keep_last=2)  # waits for step 1 first
    w.wait()
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step_00000001.pt", "step_00000002.pt"]
    assert torch.equal(ckpt.load_checkpoint(tmp_path / "step_00000001.pt")["model"]["w"], torch.zeros(4))
    assert torch.equal(ckpt.load_checkpoint(tmp_path / "step_00000002.pt")["model"]["w"], torch.ones(4))

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    w.submit({"model": {"w": weights}}, tmp_path, 3, keep_last=2)
    w.wait()
    with pytest.raises(OSError, match="disk full"):
        w.raise_if_failed()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001.pt", "step_00000002.pt"]  # no partial file


@pytest.fixture
def odd_images(tmp_path):
    """Real files of every kind the uint8 path meets: JPEG, grayscale and RGBA PNG, CMYK JPEG, a
    JPEG named .png, a BMP, and a corrupt one."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    d = tmp_path / "imgs" / "train" / "a"
    d.mkdir(parents=True)
    rgb = Image.fromarray(rng.integers(0, 256, (30, 44, 3), dtype=np.uint8))
    rgb.save(d / "rgb.jpg", quality=90)
    Image.fromarray(rng.integers(0, 256, (30, 44), dtype=np.uint8)).save(d / "gray.png")
    Image.fromarray(rng.integers(0, 256, (30, 44, 4), dtype=np.uint8)).save(d / "rgba.png")
    rgb.convert("CMYK").save(d / "cmyk.jpg")
    rgb.save(d / "named.png", format="JPEG")
    rgb.save(d / "pic.bmp")
    (d / "zbad.png").write_bytes(b"this is not a png")
    return tmp_path / "imgs"


def test_uint8_decode_matches_pil_and_words_errors_the_same(odd_images):
    import numpy as np
    from PIL import Image

    from resdecay.data.datasets import _checked_pil_loader
    from resdecay.data.fast_images import decode_uint8
    from resdecay.errors import DataError

    for f in sorted((odd_images / "train" / "a").iterdir()):
        if f.name == "zbad.png":
            with pytest.raises(DataError) as old:
                _checked_pil_loader(str(f))
            with pytest.raises(DataError) as new:
                decode_uint8(str(f))
            assert str(new.value) == str(old.value) and "cannot read image" in str(new.value)
            continue
        ref = torch.from_numpy(np.asarray(Image.open(f).convert("RGB"))).permute(2, 0, 1)
        got = decode_uint8(str(f))
        assert got.dtype == torch.uint8 and got.shape == ref.shape, f.name
        assert (got.int() - ref.int()).abs().max() <= 2, f.name  # both libjpeg(-turbo); PNG/BMP exact


def test_uint8_path_is_seeded_and_device_loader_normalises_like_the_dataset(odd_images):
    from torch.utils.data import DataLoader

    from resdecay.data import DataConfig, DeviceLoader, ResumableSampler, SeededSamples, build_dataset

    (odd_images / "train" / "a" / "zbad.png").unlink()
    ds, info = build_dataset(DataConfig("imagefolder", path=str(odd_images), augment="mae"), "train", 16)
    samples = SeededSamples(ds, seed=3)
    floats = torch.stack([samples[(i, 1)][0] for i in range(len(ds))])
    assert floats.dtype == torch.float32 and floats.shape == (len(ds), 3, 16, 16)
    torch.manual_seed(99)  # the global RNG does not matter
    assert torch.equal(samples[(2, 1)][0], floats[2]) and not torch.equal(samples[(2, 2)][0], floats[2])
    uint8_ds, uint8_info = build_dataset(DataConfig("imagefolder", path=str(odd_images), augment="mae"), "train", 16,
                                         uint8_out=True)  # the training loader's dataset: built uint8 from the start
    assert (uint8_info.mean, uint8_info.std) == (info.mean, info.std) and samples[(2, 1)][0].dtype == torch.float32
    samples = SeededSamples(uint8_ds, seed=3)
    assert samples[(2, 1)][0].dtype == torch.uint8  # uint8 batches: same pixels, normalised later
    sampler = ResumableSampler(len(samples), seed=0)
    sampler.set_epoch(1)
    loader = DeviceLoader(DataLoader(samples, batch_size=len(ds), sampler=sampler), torch.device("cpu"), info.mean, info.std)
    (x, _), = list(loader)
    order = [i for i, _ in sampler]
    torch.testing.assert_close(x, floats[order], rtol=0, atol=0)
