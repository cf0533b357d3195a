"""Data in one place (issue 21 item 4): one transform factory for every data.augment x decoder x source,
the decoder chosen once, no dataset changed from outside, and the same batches as the paths it replaced."""

from __future__ import annotations

import math
import random
from typing import get_args

import numpy as np
import pytest
import torch
from PIL import Image

from resdecay.data import DataConfig, SeededSamples, build_dataset, choose_decoder, create_transform
from resdecay.data import datasets as datasets_module
from resdecay.data.datasets import IMAGENET_MEAN, IMAGENET_STD, TensorImages
from resdecay.data.fast_images import DeviceLoader, decode_uint8, normalize
from resdecay.data.transforms import AUGMENTS, PIPELINES, RECIPES, Augment, DaliCrops, Uint8View
from resdecay.errors import ConfigError, DataError
from resdecay.train.config import load_config
from resdecay.train.distributed import DistEnv
from resdecay.train.setup import build_data

DECODERS = ("tensor", "pil", "dali")
SOURCES = ("digits", "imagefolder", "latents")


def expected(source: str, augment: str, decoder: str) -> str:
    """The contract, written out: the decode path of the training view, or "refused"."""
    if source == "imagefolder" and augment == "cifar":
        return "refused"
    if decoder == "dali" and (source != "imagefolder" or augment not in ("mae", "rrc")):
        return "refused"
    if source == "latents":
        return "latents" if augment == "none" else "refused"
    if source == "digits":
        return "memory"
    if decoder == "pil" or augment == "randaug":
        return "pil"
    return "dali" if decoder == "dali" else "uint8"


def test_the_table_names_every_augment_once():
    assert tuple(RECIPES) == AUGMENTS == get_args(Augment)
    assert all(r.about for r in RECIPES.values())
    assert RECIPES["mae"].crop_scale == (0.2, 1.0) and RECIPES["rrc"].crop_scale == (0.08, 1.0)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("augment", AUGMENTS)
def test_every_augment_decoder_source_builds_or_refuses_in_one_line(source, decoder, augment, fake_imagefolder,
                                                                     fake_latents):
    path = {"imagefolder": str(fake_imagefolder), "latents": str(fake_latents)}.get(source)
    data = DataConfig(source, path=path, augment=augment, decoder=decoder)
    want = expected(source, augment, decoder)
    size = 8 if source == "digits" else 16
    if want == "refused":
        with pytest.raises(ConfigError) as err:
            build_dataset(data, "train", size)
        assert "\n" not in str(err.value) and str(err.value).startswith("data.")
        return
    assert choose_decoder(data) == want
    ds, info = build_dataset(data, "train", size)
    x, _ = SeededSamples(ds, 0)[(0, 0)]
    assert x.dtype == torch.float32 and x.shape == ((4, 4, 4) if source == "latents" else (info.in_chans, size, size))
    evaluation, _ = build_dataset(data, "test", size, augment=False)  # every config has an evaluation view
    assert choose_decoder(data, "none") in ("memory", "pil", "uint8", "latents")
    assert evaluation[0][0].dtype == torch.float32


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("augment", AUGMENTS)
def test_create_transform_builds_or_refuses_every_combination_in_one_line(augment, pipeline):
    recipe = RECIPES[augment]
    refused = ((recipe.pad and pipeline != "memory") or (recipe.randaug and pipeline in ("uint8", "dali"))
               or (pipeline == "dali" and recipe.crop_scale is None) or (pipeline == "latents" and augment != "none"))
    make = lambda: create_transform(augment, 16, pipeline, mean=IMAGENET_MEAN, std=IMAGENET_STD, native=16)  # noqa: E731
    if refused:
        with pytest.raises(ConfigError) as err:
            make()
        assert "\n" not in str(err.value) and str(err.value).startswith("data.")
        return
    made = make()
    kind = {"uint8": Uint8View, "dali": DaliCrops}.get(pipeline)
    if kind is not None:
        assert isinstance(made, kind)
    if pipeline == "dali":
        assert made == DaliCrops(16, recipe.crop_scale, IMAGENET_MEAN, IMAGENET_STD)
    if pipeline == "latents" or (pipeline == "memory" and augment == "none"):
        assert made is None


def test_unknown_names_are_one_line():
    with pytest.raises(ConfigError, match="data.augment 'jitter' is unknown; choose one of none, flip"):
        create_transform("jitter", 16, "memory")
    with pytest.raises(ConfigError, match="unknown decode path 'gpu'"):
        create_transform("none", 16, "gpu")


# ----------------------------------------------------------------------------- no mutation
def test_the_training_dataset_is_constructed_with_its_transform_and_never_changed(fake_imagefolder, monkeypatch, tmp_path):
    built = []
    real = datasets_module._image_folder

    def recording(root, transform, loader):
        built.append((transform, dict(vars(transform))))
        return real(root, transform, loader)

    monkeypatch.setattr(datasets_module, "_image_folder", recording)
    cfg = load_config("mae-tiny-digits", ["data.name=imagefolder", f"data.path={fake_imagefolder}", "data.augment=mae",
                                          "model.img_size=16", "model.patch_size=4", "model.in_chans=3",
                                          "train.batch_size=4", f"train.out_dir={tmp_path / 'run'}"])
    data = build_data(cfg, DistEnv(), tmp_path)
    (transform, at_construction), = built
    assert isinstance(transform, Uint8View) and transform.uint8_out  # uint8 batches from the start
    assert isinstance(data.loader, DeviceLoader)
    images, _ = next(iter(data.loader))
    assert images.dtype == torch.float32 and images.shape == (4, 3, 16, 16)
    assert vars(transform) == at_construction and data.samples.dataset.transform is transform


def test_building_the_uint8_view_leaves_other_datasets_alone(fake_imagefolder):
    data = DataConfig("imagefolder", path=str(fake_imagefolder), augment="mae")
    floats, _ = build_dataset(data, "train", 16)
    before = dict(vars(floats.transform))
    uint8, _ = build_dataset(data, "train", 16, uint8_out=True)
    assert uint8.transform is not floats.transform and vars(floats.transform) == before
    assert floats[0][0].dtype == torch.float32 and uint8[0][0].dtype == torch.uint8
    with pytest.raises(ValueError, match="uint8_out applies to ImageFolder data on the uint8 path"):
        build_dataset(DataConfig("digits"), "train", 8, uint8_out=True)
    with pytest.raises(ValueError, match="not to imagefolder on the pil path"):
        build_dataset(DataConfig("imagefolder", path=str(fake_imagefolder), decoder="pil"), "train", 16, uint8_out=True)


# ----------------------------------------------------------------------------- same batches as before
def _previous_memory(augment: str, size: int, native: int, resize: bool):
    """The in-memory transform as datasets.py built it before the factory (verbatim)."""
    import torchvision.transforms.v2 as T

    ops = []
    if augment in ("mae", "rrc", "randaug"):
        scale = (0.2, 1.0) if augment == "mae" else (0.08, 1.0)
        ops.append(T.RandomResizedCrop(size, scale=scale, interpolation=T.InterpolationMode.BICUBIC, antialias=True))
    elif native != size and resize:
        ops.append(T.Resize(size, interpolation=T.InterpolationMode.BICUBIC, antialias=True))
    if augment == "cifar":
        ops.append(T.RandomCrop(size, padding=4))
    if augment != "none":
        ops.append(T.RandomHorizontalFlip())
    if augment == "randaug":
        ops += [T.RandAugment(num_ops=2, magnitude=9), T.RandomErasing(p=0.25, value=0)]
    return T.Compose(ops) if ops else None


def _previous_folder(T, augment: str, size: int, **antialias) -> list:
    """The ImageFolder crop/flip of the PIL path (v1) and of Uint8View (v2) before the factory (verbatim)."""
    bicubic = T.InterpolationMode.BICUBIC
    if augment in ("mae", "rrc"):
        scale = (0.2, 1.0) if augment == "mae" else (0.08, 1.0)
        return [T.RandomResizedCrop(size, scale=scale, interpolation=bicubic, **antialias), T.RandomHorizontalFlip()]
    ops = [T.Resize(int(math.ceil(size * 256 / 224)), interpolation=bicubic, **antialias), T.CenterCrop(size)]
    return ops + [T.RandomHorizontalFlip()] if augment == "flip" else ops


def _seeded(fn, x, seed):
    torch.manual_seed(seed)
    random.seed(seed)  # timm's RandAugment draws from Python's and NumPy's generators
    np.random.seed(seed)
    return fn(x)


@pytest.mark.parametrize("augment", AUGMENTS)
@pytest.mark.parametrize("native,resize", [(12, False), (10, True)])
def test_in_memory_views_equal_the_previous_ones(augment, native, resize):
    x = torch.rand(3, native, native, generator=torch.Generator().manual_seed(1))
    new, old = create_transform(augment, 12, "memory", native=native, resize=resize), _previous_memory(augment, 12, native, resize)
    assert (new is None) == (old is None)
    for seed in range(4):
        if new is not None:
            assert torch.equal(_seeded(new, x, seed), _seeded(old, x, seed))


@pytest.mark.parametrize("augment", ["none", "flip", "mae", "rrc", "randaug"])
def test_image_folder_views_equal_the_previous_ones(augment, tmp_path):
    import torchvision.transforms as T1
    import torchvision.transforms.v2 as T2

    rng = np.random.default_rng(2)
    path = tmp_path / "x.png"
    Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(path)
    pil, u8 = Image.open(path).convert("RGB"), decode_uint8(str(path))
    new_pil = create_transform(augment, 16, "pil", mean=IMAGENET_MEAN, std=IMAGENET_STD)
    if augment == "randaug":  # the previous path called timm with these arguments
        from timm.data import create_transform as timm_transform

        old_pil = timm_transform(16, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic",
                                 re_prob=0.25, re_mode="pixel", re_count=1, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    else:
        old_pil = T1.Compose([*_previous_folder(T1, augment, 16), T1.ToTensor(), T1.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    for seed in range(4):
        assert torch.equal(_seeded(new_pil, pil, seed), _seeded(old_pil, pil, seed))
    if augment == "randaug":
        return
    new_u8 = create_transform(augment, 16, "uint8", mean=IMAGENET_MEAN, std=IMAGENET_STD)
    old_u8 = T2.Compose(_previous_folder(T2, augment, 16, antialias=True))
    for seed in range(4):
        crop = _seeded(old_u8, u8, seed)
        assert torch.equal(_seeded(new_u8, u8, seed), normalize(crop, IMAGENET_MEAN, IMAGENET_STD))
        out = create_transform(augment, 16, "uint8", mean=IMAGENET_MEAN, std=IMAGENET_STD, uint8_out=True)
        assert torch.equal(_seeded(out, u8, seed), crop)


def test_memory_datasets_hold_the_factorys_transform(fake_fmnist):
    for name, path, size in (("digits", None, 8), ("fashion-mnist", str(fake_fmnist), 28), ("fashion-mnist-m", str(fake_fmnist), 32)):
        ds, _ = build_dataset(DataConfig(name, path=path, augment="cifar", train_subset=8), "train", size)
        assert isinstance(ds, TensorImages)
        assert [type(op).__name__ for op in ds.transform.transforms] == ["RandomCrop", "RandomHorizontalFlip"]


def test_in_memory_size_check_follows_the_recipe(fake_fmnist):
    """A resized crop makes the model's side, so only views without one need data.resize."""
    for augment in ("mae", "rrc", "randaug"):
        ds, _ = build_dataset(DataConfig("fashion-mnist", path=str(fake_fmnist), augment=augment, train_subset=4), "train", 16)
        assert ds[0][0].shape == (1, 16, 16)
    with pytest.raises(DataError, match="images are 28x28 but model.img_size is 16"):
        build_dataset(DataConfig("fashion-mnist", path=str(fake_fmnist), augment="flip"), "train", 16)
