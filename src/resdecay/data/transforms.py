"""Every image transform of resdecay, from one table: ``data.augment`` × decode path × source.

In the style of timm's ``create_transform``: ``choose_decoder`` decides, once, how the images of a
view are decoded (from the data config and the view's augmentation), and ``create_transform``
builds that view's transform from the row of ``RECIPES`` for its ``data.augment``. Nothing else
translates an augment name or reads ``data.decoder``; a data set is constructed with its transform
and nothing changes it afterwards.

Decode paths (``Pipeline``):

    memory   in-memory uint8 tensors (digits, fashion-mnist, fashion-mnist-m, cifar10/100,
             synthetic) -> transforms.v2 on floats in [0, 1]; ``TensorImages`` normalises after
    pil      ImageFolder files through PIL and transforms v1 (or timm's RandAugment pipeline),
             ending in ToTensor + Normalize
    uint8    ImageFolder files decoded to uint8 (``data.decoder=tensor``, fast_images.py),
             transforms.v2 on uint8 (``Uint8View``): normalised floats, or uint8 batches
             normalised on the device
    dali     ImageFolder training crops decoded on the GPU by DALI (dali_images.py): the crop
             parameters (``DaliCrops``); the crop draws are the uint8 path's
    latents  cached VAE codes: no transform

A new augmentation is one row of ``RECIPES`` (and one name in ``Augment``); a combination a path
cannot build is refused in one line by ``create_transform``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import torch

from ..errors import ConfigError
from .fast_images import normalize

Augment = Literal["none", "flip", "mae", "rrc", "randaug", "cifar"]
Pipeline = Literal["memory", "pil", "uint8", "dali", "latents"]
Source = Literal["memory", "folder", "latents"]
AUGMENTS, PIPELINES = get_args(Augment), get_args(Pipeline)


@dataclass(frozen=True)
class Recipe:
    """One ``data.augment`` value: which random operations a training view applies, in this order.

    Attributes:
        crop_scale: RandomResizedCrop's area range (bicubic, to the model's side); None: no
            random resized crop (evaluation view: resize / centre crop only).
        pad: RandomCrop's zero padding in pixels (CIFAR's recipe); 0: none.
        flip: RandomHorizontalFlip(0.5).
        randaug: RandAugment(2, 9) and random erasing 0.25 (MAE fine-tuning).
        about: what it is, and where the recipe comes from.
    """
    crop_scale: tuple[float, float] | None
    pad: int
    flip: bool
    randaug: bool
    about: str


RECIPES: dict[str, Recipe] = {
    "none": Recipe(None, 0, False, False, "no augmentation (the evaluation view)"),
    "flip": Recipe(None, 0, True, False, "horizontal flip only"),
    "mae": Recipe((0.2, 1.0), 0, True, False, "RandomResizedCrop 0.2-1 + flip (MAE pretraining, main_pretrain.py)"),
    "rrc": Recipe((0.08, 1.0), 0, True, False,
                  "RandomResizedCrop 0.08-1 + flip (MAE's linear probe, main_linprobe.py; supervised ImageNet)"),
    "randaug": Recipe((0.08, 1.0), 0, True, True,
                      "RandomResizedCrop 0.08-1 + flip + RandAugment(2, 9) + random erasing 0.25 (MAE fine-tuning, timm)"),
    "cifar": Recipe(None, 4, True, False, "pad-4 random crop + flip (CIFAR's supervised recipe; in-memory data sets only)"),
}

_FOLDER, _LATENTS = ("imagefolder",), ("latents",)  # every other data set is held in memory as uint8 tensors


class DataChoices(Protocol):
    """The fields of ``DataConfig`` the decode path depends on."""
    name: str
    decoder: str
    augment: str
    on_bad_file: str


def source_of(name: str) -> Source:
    """Where a data set's images come from: files of an ImageFolder, tensors in memory, or cached latents."""
    return "folder" if name in _FOLDER else "latents" if name in _LATENTS else "memory"


def choose_decoder(data: DataChoices, view: str | None = None) -> Pipeline:
    """The decode path of one view of a data set; the only reader of ``data.decoder``.

    Args:
        data: the data config (``name``, ``decoder``, ``augment``, ``on_bad_file``).
        view: the augmentation of the view being built: ``data.augment`` for training crops (the
            default), "none" for evaluation.

    Returns:
        One of ``PIPELINES`` (module docstring). ImageFolder evaluation views of a DALI run are
        decoded on the CPU ("uint8"): DALI decodes training crops only; RandAugment runs on timm's
        PIL pipeline whatever ``data.decoder`` says (fine-tuning's recipe, as MAE's).

    Raises:
        ConfigError: one line, for a configuration no path can build.
    """
    view = data.augment if view is None else view
    source, recipe = source_of(data.name), RECIPES[data.augment]
    if source == "folder" and recipe.pad:
        raise ConfigError(f"data.augment={data.augment} is CIFAR's pad-4 random crop + flip of in-memory data sets "
                          "(cifar10/100, fashion-mnist, digits); for an ImageFolder use data.augment=rrc "
                          "(RandomResizedCrop 0.08-1 + flip) or mae (RandomResizedCrop 0.2-1 + flip)")
    if data.decoder == "dali" and (source != "folder" or recipe.crop_scale is None or recipe.randaug
                                   or data.on_bad_file != "stop"):
        raise ConfigError("data.decoder=dali decodes ImageFolder training crops (data.name=imagefolder, data.augment "
                          f"mae or rrc, data.on_bad_file=stop); got {data.name}, {data.augment}, {data.on_bad_file}; "
                          "use data.decoder=tensor")
    if source == "latents":
        if view != "none":
            raise ConfigError(f"data.augment={view} augments images, but data.name=latents holds cached VAE codes; "
                              "set data.augment=none (augment the images when caching them with `resdecay latents`)")
        return "latents"
    if source == "memory":  # already decoded: data.decoder chooses how files are read, so it has nothing to choose here
        return "memory"
    if data.decoder == "pil" or RECIPES[view].randaug:
        return "pil"
    return "dali" if data.decoder == "dali" and view == data.augment else "uint8"


@dataclass(frozen=True)
class DaliCrops:
    """What ``DaliLoader`` needs to cut the uint8 path's crops on the GPU: output side, crop area
    range (the flip is always drawn after the crop, as the uint8 path's RandomHorizontalFlip) and
    the normalisation applied on the device."""
    size: int
    scale: tuple[float, float]
    mean: tuple
    std: tuple


class Uint8View:
    """uint8 (3, H, W) -> the view (uint8 when ``uint8_out``, else normalised float32).

    ``uint8_out`` is fixed at construction: training batches stay uint8 until the device
    (``DeviceLoader`` normalises them there, with the same ``mean``/``std``); evaluators get floats.
    """

    def __init__(self, ops, mean, std, uint8_out: bool = False):
        self.ops, self.mean, self.std, self.uint8_out = ops, tuple(mean), tuple(std), uint8_out

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        img = self.ops(img)
        return img.contiguous() if self.uint8_out else normalize(img, self.mean, self.std)


def _unbuildable(augment: str, recipe: Recipe, pipeline: str) -> str | None:
    """Why ``pipeline`` cannot apply ``augment``, as the one-line message; None when it can."""
    if pipeline not in PIPELINES:
        return f"unknown decode path {pipeline!r}; choose one of {', '.join(PIPELINES)}"
    if pipeline == "latents" and augment != "none":
        return f"data.augment={augment} augments images; latents take data.augment=none"
    if recipe.pad and pipeline != "memory":
        return (f"data.augment={augment} (pad-4 crop) applies to in-memory data sets only; "
                "for an ImageFolder use data.augment=rrc or mae")
    if recipe.randaug and pipeline in ("uint8", "dali"):
        return f"data.augment={augment} runs on timm's PIL pipeline; it has no {pipeline} path (data.decoder=pil)"
    if pipeline == "dali" and recipe.crop_scale is None:
        return f"data.decoder=dali cuts random resized crops; data.augment={augment} has none: use mae or rrc"
    return None


def _memory_ops(recipe: Recipe, size: int, native: int | None, resize: bool):
    """transforms.v2 on in-memory float images; normalisation follows in ``TensorImages``. None when the view
    changes nothing (data.augment=none at the native size): torchvision, whose import loads torch._dynamo (≈ 1 s),
    is then never imported."""
    if recipe.crop_scale is None and not (native != size and resize) and not (recipe.pad or recipe.flip
                                                                               or recipe.randaug):
        return None
    import torchvision.transforms.v2 as T

    ops = []
    if recipe.crop_scale is not None:
        ops.append(T.RandomResizedCrop(size, scale=recipe.crop_scale, interpolation=T.InterpolationMode.BICUBIC,
                                       antialias=True))
    elif native != size and resize:
        ops.append(T.Resize(size, interpolation=T.InterpolationMode.BICUBIC, antialias=True))
    if recipe.pad:
        ops.append(T.RandomCrop(size, padding=recipe.pad))
    if recipe.flip:
        ops.append(T.RandomHorizontalFlip())
    if recipe.randaug:
        ops += [T.RandAugment(num_ops=2, magnitude=9), T.RandomErasing(p=0.25, value=0)]
    return T.Compose(ops) if ops else None


def _folder_ops(T, recipe: Recipe, size: int, **antialias) -> list:
    """The crop/flip of an ImageFolder view, with transforms module ``T`` (v1 for PIL, v2 for uint8):
    a random resized crop, or the evaluation view (MAE: resize to 256/224 of the side, centre crop)."""
    bicubic = T.InterpolationMode.BICUBIC
    if recipe.crop_scale is not None:
        ops = [T.RandomResizedCrop(size, scale=recipe.crop_scale, interpolation=bicubic, **antialias)]
    else:
        ops = [T.Resize(int(math.ceil(size * 256 / 224)), interpolation=bicubic, **antialias), T.CenterCrop(size)]
    return ops + [T.RandomHorizontalFlip()] if recipe.flip else ops


def _pil_transform(recipe: Recipe, size: int, mean, std):
    import torchvision.transforms as T

    if recipe.randaug:  # MAE fine-tuning's timm pipeline
        from timm.data import create_transform as timm_transform

        return timm_transform(size, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic",
                              re_prob=0.25, re_mode="pixel", re_count=1, mean=mean, std=std)
    return T.Compose([*_folder_ops(T, recipe, size), T.ToTensor(), T.Normalize(mean, std)])


def create_transform(augment: str, size: int, pipeline: Pipeline, *, mean=(), std=(), native: int | None = None,
                     resize: bool = False, uint8_out: bool = False):
    """The transform of one view: ``augment`` (a ``RECIPES`` name) on decode path ``pipeline``.

    Args:
        augment: the view's augmentation (``data.augment``, or "none" for evaluation).
        size: the model's input side in pixels.
        pipeline: the decode path, from ``choose_decoder``.
        mean, std: normalisation (pil, uint8 and dali paths; in-memory sets normalise in the dataset).
        native: side of in-memory images; with ``resize`` they are resized to ``size`` when no crop does it.
        resize: ``data.resize``.
        uint8_out: uint8 path only: return uint8 images, normalised later on the device.

    Returns:
        memory: a transforms.v2 ``Compose`` or None; pil: a v1 (or timm) pipeline ending in
        Normalize; uint8: a ``Uint8View``; dali: ``DaliCrops``; latents: None.

    Raises:
        ConfigError: one line, for an augmentation the path cannot apply.
    """
    recipe = RECIPES.get(augment)
    if recipe is None:
        raise ConfigError(f"data.augment {augment!r} is unknown; choose one of {', '.join(AUGMENTS)}")
    problem = _unbuildable(augment, recipe, pipeline)
    if problem:
        raise ConfigError(problem)
    if uint8_out and pipeline != "uint8":
        raise ValueError(f"uint8_out applies to the uint8 path only, not {pipeline}")
    if pipeline == "memory":
        return _memory_ops(recipe, size, native, resize)
    if pipeline == "pil":
        return _pil_transform(recipe, size, mean, std)
    if pipeline == "uint8":
        import torchvision.transforms.v2 as T

        return Uint8View(T.Compose(_folder_ops(T, recipe, size, antialias=True)), mean, std, uint8_out)
    if pipeline == "dali":
        return DaliCrops(size, recipe.crop_scale, tuple(mean), tuple(std))
    return None  # latents
