"""Latent diffusion data: encode a dataset once with a VAE the user has on disk, train on the cache.

``resdecay latents --vae PATH --data …`` runs every image through a diffusers ``AutoencoderKL``
loaded from a local folder (``from_pretrained(PATH, local_files_only=True)``; nothing is
downloaded) and stores ``latent_dist.mean * scaling_factor`` (DiT / SiT / U-ViT feed the model
latents of roughly unit variance) with the labels in ``<out>/{train,test}.pt``. Training with
``data.name=latents data.path=<out>`` then reads these tensors (``datasets.latent_dataset``); sampling
decodes with the same VAE.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ..errors import UserError
from ..io import atomic_save, first_sentence, progress_bar
from .datasets import build_dataset

SPLITS = ("train", "test")


def load_vae(path: str | None, device: str | torch.device = "cpu"):
    """A diffusers AutoencoderKL from a local folder (config.json + weights), in eval mode."""
    if not path:
        raise UserError("latent diffusion needs a VAE: pass --vae PATH (a local diffusers AutoencoderKL folder, "
                        "e.g. a copy of stabilityai/sd-vae-ft-ema)")
    if not (Path(path) / "config.json").is_file():
        raise UserError(f"no VAE at {path} (expected a diffusers AutoencoderKL folder with config.json and weights); "
                        "pass --vae PATH")
    try:
        from diffusers import AutoencoderKL
    except ImportError:
        raise UserError("latent diffusion needs diffusers: pip install diffusers") from None
    try:
        vae = AutoencoderKL.from_pretrained(path, local_files_only=True)
    except Exception as e:  # diffusers raises OSError/ValueError/EnvironmentError variants
        raise UserError(f"cannot load the VAE at {path} ({type(e).__name__}: {first_sentence(str(e))}); "
                        "pass --vae PATH to a diffusers AutoencoderKL folder") from None
    return vae.to(device).eval()


@torch.no_grad()
def encode_dataset(data_cfg, vae_path: str, out: str | Path, img_size: int, batch_size: int = 64,
                   device: str | torch.device = "cpu", progress: bool = True) -> dict:
    """Encode the train and test splits of ``data_cfg`` (pixels in [-1, 1]) to ``out/{split}.pt``."""
    vae = load_vae(vae_path, device)
    scale = float(getattr(vae.config, "scaling_factor", 0.18215))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = replace(data_cfg, normalize="symmetric")
    written = {}
    for split in SPLITS:
        ds, info = build_dataset(cfg, split, img_size, augment=False)
        lat, labels = [], []
        for x, y in progress_bar(DataLoader(ds, batch_size=batch_size), desc=f"encode {split}", disable=not progress, leave=False):
            if x.shape[1] == 1:  # grayscale datasets: the VAE wants RGB
                x = x.repeat(1, 3, 1, 1)
            lat.append((vae.encode(x.to(device)).latent_dist.mean * scale).to(torch.float16).cpu())
            labels.append(torch.as_tensor(y))
        z = torch.cat(lat)
        meta = {"dataset": data_cfg.name, "img_size": img_size, "vae": str(vae_path), "scaling_factor": scale,
                "num_classes": info.num_classes, "shape": list(z.shape[1:])}
        atomic_save({"latents": z, "labels": torch.cat(labels), "meta": meta}, out / f"{split}.pt")
        written[split] = {"path": str(out / f"{split}.pt"), "n": len(z), **meta}
    return written


@torch.no_grad()
def decode(latents: torch.Tensor, vae_path: str, device: str | torch.device = "cpu", batch_size: int = 32) -> torch.Tensor:
    """Latents (scaled as stored) -> images in [-1, 1]."""
    vae = load_vae(vae_path, device)
    scale = float(getattr(vae.config, "scaling_factor", 0.18215))
    out = [vae.decode(z.to(device) / scale).sample.clamp(-1, 1).cpu() for z in latents.split(batch_size)]
    return torch.cat(out)
