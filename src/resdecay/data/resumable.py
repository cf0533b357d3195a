"""Sampling that makes runs resumable mid-epoch: the seeded sample wrapper and the sampler.

The sampler yields ``(index, epoch)`` and augmentation of a sample is seeded by
``(seed, epoch, index)``, so a run resumed mid-epoch sees exactly the batches and crops an
uninterrupted run would, whatever the number of DataLoader workers.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset, Sampler

from ..errors import InputMismatch
from .datasets import TensorImages


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The CPU-generator seed of one sample's augmentation: a function of (seed, epoch, index) alone."""
    return (seed * 1_000_003 + epoch) * 10_000_019 + index


class SeededSamples(Dataset):
    """Makes each sample's augmentation a function of (seed, epoch, index) alone.

    Keys are ``(index, epoch)`` from ``ResumableSampler`` (or plain indices). The global torch
    RNG is forked around the transform, so augmentation never disturbs the RNG that draws masks
    and noise in the training process.
    """

    def __init__(self, dataset: Dataset, seed: int):
        self.dataset, self.seed = dataset, seed
        self.stochastic = getattr(dataset, "transform", None) is not None or not isinstance(dataset, TensorImages)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        index, epoch = key if isinstance(key, tuple) else (key, 0)
        if not self.stochastic:
            return self.dataset[index]
        with torch.random.fork_rng(devices=[]):
            # the CPU generator only: torch.manual_seed would also (lazily) seed every accelerator
            # generator, recording a stack trace each time (a third of a decoded JPEG's cost)
            torch.default_generator.manual_seed(sample_seed(self.seed, epoch, index))
            return self.dataset[index]


class ResumableSampler(Sampler):
    """Per-epoch permutation seeded by (seed, epoch), split across ranks like DistributedSampler
    (padded to a multiple of the world size), that can start mid-epoch at ``start`` samples."""

    def __init__(self, n: int, rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True):
        self.n, self.rank, self.world, self.seed, self.shuffle = n, rank, world_size, seed, shuffle
        self.per_rank = math.ceil(n / world_size)
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return self.per_rank - self.start

    def __iter__(self):
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 7919 + self.epoch)
            order = torch.randperm(self.n, generator=g).tolist()
        else:
            order = list(range(self.n))
        order += order[: self.per_rank * self.world - self.n]  # pad so every rank gets per_rank
        mine = order[self.rank:: self.world]
        return iter([(i, self.epoch) for i in mine[self.start:]])


def check_first_sample(dataset: Dataset, expected_chans: int, img_size: int, what: str) -> None:
    """Load one sample up front so shape problems surface as one clear line before training."""
    x, _ = dataset[(0, 0)] if isinstance(dataset, SeededSamples) else dataset[0]
    if x.shape[0] != expected_chans:
        raise InputMismatch(f"{what} images have {x.shape[0]} channels but model.in_chans is {expected_chans}; "
                            f"set model.in_chans={x.shape[0]}", "in_chans", x.shape[0], expected_chans)
    if tuple(x.shape[-2:]) != (img_size, img_size):
        raise InputMismatch(f"{what} images come out {tuple(x.shape[-2:])} but model.img_size is {img_size}", "img_size",
                            x.shape[-1], img_size)
