"""``resdecay latents``: a data set encoded once with a local VAE, for latent diffusion (data/vae.py)."""

from __future__ import annotations

from ..data.vae import encode_dataset
from ..train.distributed import resolve_device
from .options import data_config


def run_latents(data: str | None, data_path: str | None, vae: str | None, out: str, img_size: int = 256,
                batch_size: int = 64, device: str = "auto", progress: bool = True) -> None:
    """Encode ``data``'s splits with the VAE at ``vae`` into ``out`` (train.pt / test.pt) and say how to
    train on them."""
    dev = resolve_device(device, "--device")
    written = encode_dataset(data_config(data, data_path), vae, out, img_size, batch_size, dev, progress=progress)
    for split, w in written.items():
        print(f"{split}: {w['n']} latents of shape {w['shape']} (x {w['scaling_factor']:g}) -> {w['path']}")
    print(f"train with: data.name=latents data.path={out}")
