"""Data: datasets (built in memory from files on disk, nothing downloaded), the resumable
sampler, Fashion-MNIST-M's compositing and the VAE latent cache for latent diffusion."""

from .datasets import (AUGMENTS, DATASETS, NORMALIZE, DataConfig, DataInfo, LatentDataset, TensorImages, build_dataset,
                       fashion_mnist_available, latent_dataset)
from .fast_images import DeviceLoader, uint8_batches
from .samplers import ResumableSampler, SeededSamples, check_first_sample

__all__ = ["AUGMENTS", "DATASETS", "NORMALIZE", "DataConfig", "DataInfo", "DeviceLoader", "LatentDataset", "ResumableSampler",
           "SeededSamples", "TensorImages", "build_dataset", "check_first_sample", "fashion_mnist_available",
           "latent_dataset", "uint8_batches"]
