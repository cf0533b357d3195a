"""Data paths that failed or misled (issue 23.9 and 23.13): check-data on every data set, empty image
folders, CIFAR pickles with bytes keys, one meaning for data.augment=cifar, and image decoding without
torchvision's deprecated decoders."""

from __future__ import annotations

import io
import pickle
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import assert_one_line_error, run
from resdecay.data import DataConfig, build_dataset, fast_images
from resdecay.data.fast_images import decode_uint8
from resdecay.data.transforms import Uint8View
from resdecay.errors import ConfigError, DataError


def cifar_batch(n: int, rng, label_key: str = "labels") -> dict:
    return {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), label_key: list(np.arange(n) % 10)}


def write_cifar(root, name: str, keys: str = "str", protocol: int = pickle.HIGHEST_PROTOCOL):
    """A fake CIFAR-10/100 folder in torchvision's layout; ``keys="bytes"`` writes b"data", as a dict read
    from the original Python-2 pickles with encoding="bytes" and pickled again comes out."""
    rng = np.random.default_rng(0)
    folder = root / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
    folder.mkdir(parents=True)
    files = ([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]) if name == "cifar10" else ["train", "test"]
    for fname in files:
        batch = cifar_batch(8, rng, "labels" if name == "cifar10" else "fine_labels")
        if keys == "bytes":
            batch = {k.encode(): v for k, v in batch.items()}
        with open(folder / fname, "wb") as f:
            pickle.dump(batch, f, protocol=protocol)
    return root


@pytest.mark.parametrize("name", ["digits", "fashion-mnist", "fashion-mnist-m", "cifar10", "cifar100", "synthetic",
                                  "latents"])
def test_check_data_works_for_every_data_set(name, capsys, tmp_path, fake_fmnist, fake_latents):
    """issue 23.13: `check-data --data NAME` asked for model.img_size, then refused that override without
    --preset, so every in-memory data set failed."""
    paths = {"fashion-mnist": fake_fmnist, "fashion-mnist-m": fake_fmnist, "latents": fake_latents,
             "cifar10": tmp_path / "c10", "cifar100": tmp_path / "c100"}
    if name.startswith("cifar"):
        write_cifar(paths[name], name)
    argv = ["check-data", "--data", name, "--no-progress"]
    if name in paths:
        argv += ["--data-path", str(paths[name])]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert f"check-data: {name}: " in out and "all readable" in out


def test_check_data_refuses_folders_without_images(capsys, tmp_path, fake_imagefolder):
    """issue 23.13: an empty folder (or one with class folders but no images) said '0 images decoded', exit 0."""
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "check-data", "--data-path", str(tmp_path / "empty"), "--no-progress")
    assert_one_line_error(code, err, f"{tmp_path / 'empty'} holds no images in class folders")
    notes = tmp_path / "notes" / "train" / "cat"
    notes.mkdir(parents=True)
    (notes / "readme.txt").write_text("not an image")
    code, _, err = run(capsys, "check-data", "--data-path", str(tmp_path / "notes"), "--no-progress")
    assert_one_line_error(code, err, f"{tmp_path / 'notes' / 'train'} holds no images")
    for png in (fake_imagefolder / "val").rglob("*.png"):
        png.unlink()
    code, _, err = run(capsys, "check-data", "--data-path", str(fake_imagefolder), "--no-progress")
    assert_one_line_error(code, err, f"{fake_imagefolder / 'val'} holds no images")


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
@pytest.mark.parametrize("protocol", [2, 4])
def test_cifar_batches_with_bytes_keys_load(tmp_path, name, protocol):
    """issue 23.13: batches whose keys are bytes (b'data', b'labels') failed with KeyError: 'data'."""
    ref, _ = build_dataset(DataConfig(name, path=str(write_cifar(tmp_path / "s", name))), "train", 32)
    got, info = build_dataset(DataConfig(name, path=str(write_cifar(tmp_path / "b", name, "bytes", protocol))), "train", 32)
    assert len(got) == len(ref) == (40 if name == "cifar10" else 8) and info.num_classes == (10 if name == "cifar10" else 100)
    assert torch.equal(got.images, ref.images) and torch.equal(got.labels, ref.labels)


def test_cifar_batch_of_the_wrong_shape_is_one_line(tmp_path):
    folder = write_cifar(tmp_path / "c", "cifar10") / "cifar-10-batches-py"
    with open(folder / "data_batch_1", "wb") as f:
        pickle.dump({b"images": np.zeros((2, 3072), np.uint8)}, f)
    with pytest.raises(DataError, match=r"data_batch_1 as a cifar10 batch: it has no 'data' and 'labels'.*found 'images'"):
        build_dataset(DataConfig("cifar10", path=str(tmp_path / "c")), "train", 32)
    with open(folder / "data_batch_1", "wb") as f:
        pickle.dump([1, 2, 3], f)
    with pytest.raises(DataError, match="it holds a list, not the dict"):
        build_dataset(DataConfig("cifar10", path=str(tmp_path / "c")), "train", 32)


def test_augment_cifar_has_one_meaning(fake_imagefolder, capsys, tmp_path):
    """issue 23.9: data.augment=cifar meant a pad-4 crop in memory but RandomResizedCrop(0.08, 1) on an
    ImageFolder. Now it is the pad-4 crop only, refused on an ImageFolder; rrc names the resized crop."""
    with pytest.raises(ConfigError, match="data.augment=cifar is CIFAR's pad-4 random crop.*use data.augment=rrc"):
        build_dataset(DataConfig("imagefolder", path=str(fake_imagefolder), augment="cifar"), "train", 32)
    code, _, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", "data.name=imagefolder",
                       f"data.path={fake_imagefolder}", "data.augment=cifar", f"train.out_dir={tmp_path / 'run'}")
    assert_one_line_error(code, err, "data.augment=cifar", "data.augment=rrc")
    assert not (tmp_path / "run").exists()
    ds, _ = build_dataset(DataConfig("digits", augment="cifar"), "train", 8)
    assert [type(op).__name__ for op in ds.transform.transforms] == ["RandomCrop", "RandomHorizontalFlip"]
    assert ds.transform.transforms[0].padding == [4, 4, 4, 4]


@pytest.mark.parametrize("decoder", ["tensor", "pil"])
def test_rrc_and_mae_crop_scales(fake_imagefolder, decoder):
    """rrc is MAE's linear-probe crop (main_linprobe.py: torchvision's default scale 0.08-1), mae its
    pretraining crop (main_pretrain.py: 0.2-1), on every path."""
    for augment, scale in (("rrc", (0.08, 1.0)), ("mae", (0.2, 1.0))):
        folder, _ = build_dataset(DataConfig("imagefolder", path=str(fake_imagefolder), augment=augment, decoder=decoder),
                                  "train", 32)
        view = folder.transform.ops if isinstance(folder.transform, Uint8View) else folder.transform
        crop = view.transforms[0]
        assert type(crop).__name__ == "RandomResizedCrop" and tuple(crop.scale) == scale
        assert folder[0][0].shape == (3, 32, 32)
        memory, _ = build_dataset(DataConfig("digits", augment=augment), "train", 8)
        assert tuple(memory.transform.transforms[0].scale) == scale and memory[0][0].shape == (1, 8, 8)


def _encoded(fmt: str) -> bytes:
    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(buf, fmt)
    return buf.getvalue()


def test_imagefolder_decoding_emits_no_deprecation_warning(fake_imagefolder):
    """issue 23.13: the default (tensor) decoder called torchvision.io.decode_image, deprecated since
    torchvision 0.29 (a DeprecationWarning per image)."""
    (fake_imagefolder / "train" / "cat" / "x.jpg").write_bytes(_encoded("JPEG"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for augment in ("none", "mae", "rrc", "flip"):
            ds, _ = build_dataset(DataConfig("imagefolder", path=str(fake_imagefolder), augment=augment), "train", 16)
            images = [ds[i][0] for i in range(len(ds))]
    deprecated = [f"{w.category.__name__}: {w.message}" for w in caught
                  if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning))
                  or "deprecat" in str(w.message).lower()]
    assert not deprecated, deprecated[0][:300]
    assert len(images) == 13 and all(x.shape == (3, 16, 16) for x in images)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "BMP"])
def test_decode_uint8_gives_pil_pixels(tmp_path, fmt):
    """The supported decoders (TorchCodec when installed, else PIL) read JPEG and PNG as PIL does."""
    path = tmp_path / f"x.{fmt.lower()}"
    path.write_bytes(_encoded(fmt))
    got = decode_uint8(str(path))
    ref = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)
    assert got.dtype == torch.uint8 and got.shape == (3, 20, 30)
    assert (got.int() - ref.int()).abs().max() <= (0 if fmt != "JPEG" else 2)


def test_decode_uint8_routes_and_falls_back(tmp_path, monkeypatch):
    """JPEG and 8-bit PNG go to TorchCodec's decoder; 16-bit PNG, other formats and whatever it cannot
    read go to PIL, which words the error of a file neither reads."""
    calls = []

    def refusing(raw, mode):
        calls.append(raw[:4])
        raise RuntimeError("cannot decode")

    monkeypatch.setattr(fast_images, "_torchcodec_decoder", lambda: refusing)
    files = {"a.jpg": _encoded("JPEG"), "b.png": _encoded("PNG"), "c.bmp": _encoded("BMP")}
    buf = io.BytesIO()
    Image.fromarray(np.full((4, 5), 40000, dtype=np.uint16)).save(buf, "PNG")  # a 16-bit greyscale PNG
    files["d.png"] = buf.getvalue()
    for fname, raw in files.items():
        (tmp_path / fname).write_bytes(raw)
        assert decode_uint8(str(tmp_path / fname)).dtype == torch.uint8  # PIL after the refusal
    assert calls == [files["a.jpg"][:4], files["b.png"][:4]]
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8\xff" + b"junk")
    with pytest.raises(DataError, match=r"cannot read image .*bad\.jpg: UnidentifiedImageError"):
        decode_uint8(str(tmp_path / "bad.jpg"))
