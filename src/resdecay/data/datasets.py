"""Datasets, each constructed with its view's transform (transforms.py). Nothing here downloads anything.

Supported (``data.name``):
    digits         scikit-learn's embedded 8x8 digits (1,797 images; stratified 80/20 split)
    fashion-mnist  IDX files (.gz or raw) in ``data.path`` (default: Debian's dataset-fashion-mnist)
    fashion-mnist-m  the same garments composited onto photographic backgrounds (fashion_mnist_m.py):
                   RGB, ``data.canvas`` pixels, nuisances chosen by ``data.nuisances``
    cifar10/100    torchvision's on-disk format (``cifar-10-batches-py`` / ``cifar-100-python``)
    imagefolder    ImageNet / ImageNet-100 layout: ``path/train/<class>/*`` and ``path/val/<class>/*``
    wds            WebDataset tar shards (``<key>.jpg`` + ``<key>.cls``), ``data.path`` / ``data.val_path``
                   brace patterns or a shard folder (shards.py); decoded and transformed as an ImageFolder
    hf             a Hugging Face ``datasets`` folder (``save_to_disk``) or parquet files, columns
                   ``data.image_column`` / ``data.label_column`` (hf_datasets.py); likewise
    synthetic      random images (benchmarks); size from the model
    latents        VAE latents cached by ``resdecay latents`` (latent diffusion), in ``data.path``

Determinism: the sampler (resumable.py) yields ``(index, epoch)`` and augmentation of a sample is
seeded by ``(seed, epoch, index)``, so a run resumed mid-epoch sees exactly the batches and crops an
uninterrupted run would, whatever the number of DataLoader workers.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Literal, get_args

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import ConfigError, DataError, InputMismatch, check_fields
from ..io import safe_load
from ..safe_pickle import load_data_pickle
from .digits import load_digits_split
from .fashion_mnist_m import NUISANCES, composite, validate_knobs
from .fast_images import BadImage, bad_image_reason, decode_uint8
from .hf_datasets import hf_dataset
from .info import IMAGENET_MEAN, IMAGENET_STD, DataInfo, folder_stats  # noqa: F401  (re-exported)
from .shards import wds_dataset
from .subsets import SUBSET_SEED, balanced_indices, balanced_subset
from .transforms import RECIPES, Augment, choose_decoder, create_transform

DatasetName = Literal["digits", "fashion-mnist", "fashion-mnist-m", "cifar10", "cifar100", "imagefolder", "wds", "hf",
                      "synthetic", "latents"]
Normalize = Literal["dataset", "symmetric"]
Decoder = Literal["tensor", "pil", "dali"]
DATASETS, NORMALIZE = get_args(DatasetName), get_args(Normalize)
FASHION_MNIST_DEBIAN = "/usr/share/datasets/fashion-mnist"
SHARDED = ("wds", "hf")  # image files in shards / a datasets folder, read like an ImageFolder's
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass
class DataConfig:
    name: DatasetName = "digits"
    path: str | None = None  # dataset folder; fashion-mnist defaults to the Debian path
    augment: Augment = "none"  # none | flip | mae | rrc | randaug | cifar: one table, transforms.RECIPES
    num_workers: int = 0  # DataLoader worker processes (0 = load in the main process)
    train_subset: int | None = None  # train on N images only (quick runs): a class-balanced subset drawn with subset_seed (subsets.py)
    resize: bool = False  # resize fixed-size datasets to model.img_size instead of refusing
    normalize: Normalize = "dataset"  # dataset (per-channel mean/std) | symmetric (pixels to [-1, 1], diffusion)
    canvas: int = 32  # fashion-mnist-m: image side in pixels
    nuisances: list[str] = field(default_factory=lambda: list(NUISANCES))  # fashion-mnist-m: which nuisances are on
    composition: Literal["photos", "textures"] = "photos"  # fashion-mnist-m: photographs, or the second generator's
    #                                                        procedural textures and milder draws (fashion_mnist_m.py)
    subset_seed: int = SUBSET_SEED  # seeds every N-image subset: train_subset, train.online_eval_size, eval --max-train
    dataset_seed: int = 0  # fashion-mnist-m: image i of a split is drawn from a generator seeded by (dataset_seed, split, i)
    on_bad_file: Literal["stop", "skip"] = "stop"  # an unreadable image in training: stop the run | skip (replace it deterministically, list it in <run>/bad_files.txt)
    decoder: Decoder = "tensor"  # imagefolder: tensor (uint8 decode + transforms.v2, fast_images.py) | pil (PIL + v1 transforms)
    #                              | dali (training crops decoded on the GPU by NVIDIA DALI, dali_images.py; optional package);
    #                              read only by transforms.choose_decoder
    val_path: str | None = None  # wds / hf: the test split's shards / data set, when data.path holds the training split only
    image_column: str = "image"  # hf: the column of encoded images
    label_column: str = "label"  # hf: the column of class indices

    def validate(self) -> None:
        check_fields(self, "data")
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers must be >= 0, got {self.num_workers}")
        problem = validate_knobs(self.canvas, self.nuisances)
        if problem:
            raise ConfigError(problem)
        if self.train_subset is not None and self.train_subset < 1:
            raise ConfigError(f"data.train_subset must be a positive number of images, got {self.train_subset}")
        choose_decoder(self, "none")  # refuses impossible name x augment x decoder combinations; every config has an eval view


def fashion_mnist_available(path: str | None = None) -> bool:
    root = Path(path or FASHION_MNIST_DEBIAN)
    return any((root / f"train-images-idx3-ubyte{ext}").exists() for ext in ("", ".gz"))


# ----------------------------------------------------------------------------- raw loaders
def _need_dir(path: str | None, name: str, hint: str) -> Path:
    if not path:
        raise DataError(f"data.path is required for {name}: {hint}")
    root = Path(path).expanduser()
    if not root.exists():
        raise DataError(f"data path {root} does not exist; pass data.path=<folder> ({hint})")
    if not root.is_dir():
        raise DataError(f"data path {root} is not a folder; pass data.path=<folder> ({hint})")
    return root


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
        zero, dtype, ndim = raw[0:2], raw[2], raw[3]
        if zero != b"\x00\x00" or dtype != 0x08:
            raise ValueError("not an unsigned-byte IDX file")
        shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
        return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)
    except (OSError, ValueError, EOFError, IndexError) as e:
        raise DataError(f"cannot read IDX file {path}: {e}") from None


def _load_fashion_mnist(path: str | None, train: bool):
    root = _need_dir(path or FASHION_MNIST_DEBIAN, "fashion-mnist",
                     "a folder with train-images-idx3-ubyte[.gz] etc.; apt-get install dataset-fashion-mnist")
    prefix = "train" if train else "t10k"
    files = []
    for kind in ("images-idx3", "labels-idx1"):
        cands = [root / f"{prefix}-{kind}-ubyte{ext}" for ext in (".gz", "")]
        found = next((c for c in cands if c.exists()), None)
        if found is None:
            raise DataError(f"data path {root} holds no Fashion-MNIST file {cands[1].name}[.gz]")
        files.append(found)
    images, labels = _read_idx(files[0]), _read_idx(files[1])
    if images.ndim != 3 or len(images) != len(labels):
        raise DataError(f"{files[0]} and {files[1]} do not hold matching images and labels")
    return torch.from_numpy(images.copy()).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


@lru_cache(maxsize=4)
def _fashion_mnist_m_stats(path: str | None, canvas: int, nuisances: tuple, seed: int, composition: str = "photos"):
    """Per-channel mean/std of the first 2,000 composited training images (train statistics
    normalise both splits)."""
    garments, _ = _load_fashion_mnist(path, True)
    x = composite(garments[:2000], "train", canvas, nuisances, seed, composition=composition).float().div_(255.0)
    return tuple(x.mean((0, 2, 3)).tolist()), tuple(x.std((0, 2, 3)).tolist())


def _load_fashion_mnist_m(cfg: DataConfig, train: bool, limit: int | None):
    garments, labels = _load_fashion_mnist(cfg.path, train)
    chosen = balanced_indices(labels, limit, cfg.subset_seed) if limit else np.arange(len(labels))
    garments, labels = garments[chosen], labels[chosen]  # composite only what is used; image i is the same either way
    images = composite(garments, "train" if train else "test", cfg.canvas, cfg.nuisances, cfg.dataset_seed, indices=chosen,
                       composition=cfg.composition)
    return images, labels, _fashion_mnist_m_stats(cfg.path, cfg.canvas, tuple(cfg.nuisances), cfg.dataset_seed,
                                                  cfg.composition)


def _cifar_fields(entry, f: Path, name: str):
    """(images, labels) of one unpickled CIFAR batch. Keys may be str (the files read with
    encoding="latin1", as torchvision does) or bytes (b"data": the same Python-2 pickles read with
    encoding="bytes", as CIFAR's own page shows, and copies re-pickled from such a load); both are
    accepted, so a valid copy is never refused for how it was pickled."""
    if not isinstance(entry, dict):
        raise DataError(f"cannot read {f} as a {name} batch: it holds a {type(entry).__name__}, not the dict of "
                        "'data' and 'labels' of torchvision's format")
    entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in entry.items()}
    label_key = next((k for k in ("labels", "fine_labels") if k in entry), None)
    if "data" not in entry or label_key is None:
        found = ", ".join(sorted(map(repr, entry))[:8]) or "none"
        raise DataError(f"cannot read {f} as a {name} batch: it has no 'data' and 'labels' (or 'fine_labels') keys "
                        f"(found {found}); use the batches of CIFAR's python version (torchvision's format)")
    return entry["data"], entry[label_key]


def _load_cifar(path: str | None, name: str, train: bool):
    """torchvision's on-disk CIFAR format, read directly (python pickles of uint8 rows); no md5
    check, so copies re-pickled by other tools load too. The pickles are read by a restricted
    unpickler that admits plain arrays only (safe_pickle.py): a crafted file cannot run code."""

    folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
    root = _need_dir(path, name, f"the folder that contains {folder}/ (torchvision's format)")
    if root.name != folder:
        root = root / folder
    if name == "cifar10":
        files = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    else:
        files = ["train" if train else "test"]
    images, labels = [], []
    for fname in files:
        f = root / fname
        if not f.is_file():
            raise DataError(f"{name}: {f} is missing; data.path must contain {folder}/ in torchvision's format")
        data, batch_labels = _cifar_fields(load_data_pickle(f, f"{name} batch"), f, name)
        try:
            images.append(np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.extend(batch_labels)
        except Exception as e:
            raise DataError(f"cannot read {f} as a {name} batch ({type(e).__name__}: {e})") from None
    return torch.from_numpy(np.concatenate(images)), torch.as_tensor(labels, dtype=torch.int64)


# ----------------------------------------------------------------------------- datasets
class TensorImages(Dataset):
    """uint8 images (N, C, H, W) in memory -> normalised float tensors, optional augmentation."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, info: DataInfo, transform=None):
        self.images, self.labels, self.info, self.transform = images, labels, info, transform
        self.mean = torch.tensor(info.mean).view(-1, 1, 1)
        self.std = torch.tensor(info.std).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        x = self.images[i].float().div_(255.0)
        if self.transform is not None:
            x = self.transform(x)
        return (x - self.mean) / self.std, int(self.labels[i])


def _checked_pil_loader(path: str):
    """The whole image decoded to RGB (a truncated file fails here, not later in a transform)."""
    from PIL import Image

    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except Exception as e:
        raise BadImage(str(path), bad_image_reason(e)) from None


def _image_folder(root: Path, transform, loader=_checked_pil_loader):
    from torchvision.datasets import ImageFolder

    try:
        return ImageFolder(str(root), transform=transform, loader=loader)
    except FileNotFoundError as e:
        raise DataError(f"data path {root} holds no images in class folders ({e}); "
                        f"expected {root}/<class>/<image>{IMG_EXTENSIONS[0]}") from None


def _folder_dataset(cfg: DataConfig, train: bool, img_size: int, aug: str, pipeline: str, uint8_out: bool):
    """An ImageFolder split, constructed with its view's transform (``transforms.create_transform``)."""
    root = _need_dir(cfg.path, "imagefolder", "ImageNet layout: <path>/train/<class>/*.JPEG and <path>/val/...")
    sub = root / ("train" if train else "val")
    if not sub.is_dir():
        if not train:
            raise DataError(f"data path {root} has no val/ folder for evaluation; add <path>/val/<class>/*")
        sub = root
    mean, std = folder_stats(cfg)
    # DALI decodes the training crops in its own loader; the dataset keeps the same crops on the CPU (uint8 path)
    view = "uint8" if pipeline == "dali" else pipeline
    transform = create_transform(aug, img_size, view, mean=mean, std=std, uint8_out=uint8_out)
    ds = _image_folder(sub, transform, loader=decode_uint8 if view == "uint8" else _checked_pil_loader)
    info = DataInfo("imagefolder", len(ds.classes), 3, None, mean, std)
    if cfg.train_subset and train:  # the folder lists class by class: its first N would be a few classes
        ds = balanced_subset(ds, cfg.train_subset, cfg.subset_seed)
    return ds, info


def normalization_card(cfg: DataConfig, info: DataInfo) -> str:
    """Which per-channel statistics normalise the images, in words, for protocol cards: on an
    ImageFolder ``data.normalize=dataset`` means ImageNet's, whatever the folder holds (its own
    statistics are not computed), so cards say so rather than "dataset".

    Args:
        cfg: the data config; info: what ``build_dataset`` returned with the split.
    """
    stats = f"mean {tuple(round(m, 4) for m in info.mean)} std {tuple(round(v, 4) for v in info.std)}"
    if cfg.normalize == "symmetric":
        return f"symmetric: pixels to [-1, 1] ({stats})"
    if cfg.name in ("imagefolder", *SHARDED):
        return f"ImageNet's mean/std for any folder (data.normalize=dataset on an imagefolder): {stats}"
    return f"{cfg.name}'s own mean/std: {stats}"


def build_dataset(cfg: DataConfig, split: str, img_size: int, augment: bool | None = None, uint8_out: bool = False):
    """The ``split`` ("train" | "test") of a dataset as (Dataset, DataInfo).

    Args:
        cfg: the data config.
        split: "train" or "test".
        img_size: the model's input side.
        augment: None: training views get ``cfg.augment``, test views none; False: no augmentation
            (frozen-feature evaluation); True: ``cfg.augment`` on either split.
        uint8_out: images decoded on the uint8 path (``choose_decoder`` says "uint8" or "dali")
            come out as uint8, to be normalised on the device with ``DataInfo.mean``/``std``
            (``DeviceLoader``); the training loader asks for this. Any other path refuses it.
    """
    cfg.validate()
    train = split == "train"
    aug = cfg.augment if (augment is None and train) or augment else "none"
    pipeline = choose_decoder(cfg, aug)
    if uint8_out and pipeline not in ("uint8", "dali"):
        raise ValueError(f"uint8_out applies to ImageFolder data on the uint8 path, not to {cfg.name} on the {pipeline} path")
    if pipeline == "latents":
        return latent_dataset(cfg, split)
    if cfg.name in SHARDED:  # files decoded as an ImageFolder's (shards.py, hf_datasets.py)

        return (wds_dataset if cfg.name == "wds" else hf_dataset)(cfg, train, img_size, aug)
    if pipeline != "memory":
        return _folder_dataset(cfg, train, img_size, aug, pipeline, uint8_out)
    images, labels, info = _memory_split(cfg, train, img_size)
    native = info.native_size
    if native != img_size and not cfg.resize and RECIPES[aug].crop_scale is None:  # a resized crop makes img_size pixels
        raise InputMismatch(
            f"{cfg.name} images are {native}x{native} but model.img_size is {img_size}; "
            f"set model.img_size={native} (with a patch_size that divides it) or data.resize=true",
            "img_size", native, img_size)
    transform = create_transform(aug, img_size, pipeline, native=native, resize=cfg.resize)
    return TensorImages(images, labels, info, transform), info


def _memory_split(cfg: DataConfig, train: bool, img_size: int):
    """(uint8 images, labels, DataInfo) of a data set held in memory."""
    if cfg.name == "digits":
        images, labels = load_digits_split(train)
        stats = ((0.3056,), (0.3777,))
    elif cfg.name == "fashion-mnist":
        images, labels = _load_fashion_mnist(cfg.path, train)
        stats = ((0.2860,), (0.3530,))
    elif cfg.name == "fashion-mnist-m":
        images, labels, stats = _load_fashion_mnist_m(cfg, train, cfg.train_subset if train else None)
    elif cfg.name in ("cifar10", "cifar100"):
        images, labels = _load_cifar(cfg.path, cfg.name, train)
        stats = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
    else:  # synthetic: a fixed random set, for benchmarks and smoke tests
        g = torch.Generator().manual_seed(0 if train else 1)
        n = 2048 if train else 512
        images = torch.randint(0, 256, (n, 3, img_size, img_size), dtype=torch.uint8, generator=g)
        labels = torch.randint(0, 10, (n,), generator=g)
        stats = ((0.5,) * 3, (0.29,) * 3)
    if len(images) == 0:
        raise DataError(f"{cfg.name} at {cfg.path} holds no images")
    if cfg.train_subset and train and cfg.name != "fashion-mnist-m":  # fashion-mnist-m composited its subset only
        chosen = torch.from_numpy(balanced_indices(labels, cfg.train_subset, cfg.subset_seed))
        images, labels = images[chosen], labels[chosen]
    num_classes = 100 if cfg.name == "cifar100" else 10
    if cfg.normalize == "symmetric":  # diffusion models see pixels in [-1, 1]
        stats = ((0.5,) * images.shape[1], (0.5,) * images.shape[1])
    return images, labels, DataInfo(cfg.name, num_classes, int(images.shape[1]), int(images.shape[-1]), *stats)


class LatentDataset(Dataset):
    """VAE latents cached by ``resdecay latents`` (see ``data.vae``), with their labels."""

    def __init__(self, latents: torch.Tensor, labels: torch.Tensor):
        self.latents, self.labels = latents, labels

    def __len__(self) -> int:
        return len(self.latents)

    def __getitem__(self, i: int):
        return self.latents[i].float(), int(self.labels[i])


def latent_dataset(cfg: DataConfig, split: str):
    """(LatentDataset, DataInfo) for ``data.name=latents``; ``data.path`` is a ``resdecay latents`` folder."""
    f = Path(cfg.path or "") / f"{'train' if split == 'train' else 'test'}.pt"
    if not cfg.path or not f.is_file():
        raise DataError(f"no cached latents at {f}; run `resdecay latents --vae PATH --data ... --out DIR` "
                        "and pass data.path=DIR")
    blob = safe_load(f, DataError, f"{f} is not a resdecay latents file ({{kind}}); rebuild it with `resdecay latents`")
    try:
        z, y, meta = blob["latents"], blob["labels"], blob["meta"]
    except (KeyError, TypeError) as e:
        raise DataError(f"{f} is not a resdecay latents file ({type(e).__name__}); rebuild it with `resdecay latents`") from None
    if cfg.train_subset and split == "train":
        chosen = torch.from_numpy(balanced_indices(y, cfg.train_subset, cfg.subset_seed))
        z, y = z[chosen], y[chosen]
    info = DataInfo("latents", int(meta["num_classes"]), int(z.shape[1]), int(z.shape[-1]), (0.0,), (1.0,))
    return LatentDataset(z, y), info
