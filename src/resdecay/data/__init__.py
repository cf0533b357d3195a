"""Data: datasets (built in memory from files on disk, nothing downloaded), every transform from one
table (transforms.py), the resumable sampler (resumable.py), Fashion-MNIST-M's compositing and the
VAE latent cache for latent diffusion."""

from .datasets import (
    DATASETS,
    NORMALIZE,
    DataConfig,
    DataInfo,
    LatentDataset,
    TensorImages,
    build_dataset,
    fashion_mnist_available,
    latent_dataset,
)
from .fast_images import DeviceLoader
from .resumable import ResumableSampler, SeededSamples, check_first_sample
from .transforms import AUGMENTS, RECIPES, choose_decoder, create_transform

__all__ = ["AUGMENTS", "DATASETS", "NORMALIZE", "RECIPES", "DataConfig", "DataInfo", "DeviceLoader", "LatentDataset",
           "ResumableSampler", "SeededSamples", "TensorImages", "build_dataset", "check_first_sample", "choose_decoder",
           "create_transform", "fashion_mnist_available", "latent_dataset"]
