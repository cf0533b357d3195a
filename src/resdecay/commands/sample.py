"""``resdecay sample``: images from a diffusion checkpoint (EMA weights where the run kept them), as a
PNG grid and an ADM-format ``.npz`` (uint8 NHWC under ``arr_0``, what OpenAI's evaluator and
``resdecay fid`` read). Under torchrun the N samples are split across ranks (rank r draws with seed
``seed + r``) and gathered on rank 0, so N is met exactly, whatever the world size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..data.vae import decode, load_vae
from ..diffusion.samplers import DEFAULT_SAMPLER, DEFAULT_STEPS, ODE_ATOL, ODE_RTOL, sample, save_npz, to_uint8
from ..errors import UserError
from ..eval.inputs import check_writable
from ..io import run_dir_of
from ..models import is_diffusion
from ..train import distributed as dist_env
from ..train.checkpoint import load_model


def save_grid(images_uint8: np.ndarray, path: Path, max_images: int = 64) -> None:
    """NHWC uint8 -> one PNG grid (torchvision's make_grid)."""
    from torchvision.utils import make_grid, save_image

    x = torch.from_numpy(images_uint8[:max_images]).permute(0, 3, 1, 2).float() / 255.0
    nrow = int(np.ceil(np.sqrt(len(x))))
    save_image(make_grid(x, nrow=nrow, padding=1, pad_value=1.0), str(path))


def run_sample(checkpoint: str, n: int = 64, sampler: str | None = None, steps: int | None = None, cfg_scale: float = 1.0,
               labels: list[int] | None = None, seed: int = 0, batch_size: int = 256, vae: str | None = None,
               out: str | None = None, device: str = "auto", use_ema: bool = True, progress: bool = True,
               atol: float | None = None, rtol: float | None = None) -> dict:
    """``resdecay sample``: every input (checkpoint, sampler options, VAE, output folder) is checked
    before the first network evaluation, so a typo never costs a sampling run.

    Args:
        checkpoint: a diffusion checkpoint; n: samples in all (split across torchrun ranks);
        sampler, steps, cfg_scale, labels, seed, batch_size, atol, rtol: the sampler's options;
        vae: the VAE folder of latent models; out: output folder (default ``<run>/samples``);
        device, use_ema, progress: as the CLI options.
    """
    if n < 1:
        raise UserError(f"--n must be a positive number of samples, got {n}")
    if batch_size < 1:
        raise UserError(f"--batch-size must be a positive integer, got {batch_size}")
    env = dist_env.setup(device)
    model, cfg = load_model(checkpoint, env.device, ema=use_ema)
    m = cfg.model
    if not is_diffusion(m.family):
        raise UserError(f"{checkpoint} is a {m.family} model; `resdecay sample` needs a diffusion checkpoint (uvit, sit)")
    latent = cfg.data.name == "latents"
    if latent and not vae:
        raise UserError(f"{checkpoint} was trained on VAE latents: pass --vae PATH (the VAE used by `resdecay latents`) to decode")
    if vae and not latent:  # it would be silently unused
        raise UserError(f"{checkpoint} was trained on pixels ({cfg.data.name}), so there is nothing to decode: drop --vae")
    if latent:
        load_vae(vae)  # a wrong VAE folder is found now, not after sampling; decode() loads it again
    out_dir = check_writable(Path(out) if out else run_dir_of(Path(checkpoint)) / "samples",
                             "pass --out DIR (a folder you can write)")
    sampler = sampler or DEFAULT_SAMPLER[m.objective]
    steps = steps if steps is not None else DEFAULT_STEPS.get(sampler, 50)
    if sampler != "dopri5" and (atol is not None or rtol is not None):  # silently unused otherwise
        raise UserError(f"--atol/--rtol set the dopri5 sampler's tolerances; sampler {sampler} takes a fixed --steps "
                        "instead: drop them or pass --sampler dopri5")
    atol = ODE_ATOL if atol is None else atol
    rtol = ODE_RTOL if rtol is None else rtol
    info: dict = {"nfe": 0.0}
    mine = len(range(env.rank, n, env.world_size))  # rank r takes samples r, r+W, ...
    my_labels = None if labels is None else torch.as_tensor([labels[i % len(labels)] for i in range(env.rank, n, env.world_size)])
    g = torch.Generator(device="cpu").manual_seed(seed + env.rank)
    if mine:
        x = sample(model, mine, sampler=sampler, steps=steps, cfg_scale=cfg_scale, labels=my_labels,
                   image_shape=(m.in_chans, m.img_size, m.img_size), generator=g, device=env.device,
                   batch_size=batch_size, progress=progress and env.is_main, clip_denoised=not latent,
                   atol=atol, rtol=rtol, info=info)
        if latent:
            x = decode(x, vae, env.device)
        imgs = to_uint8(x.cpu())  # (n_rank, H, W, C)
    else:  # more ranks than samples
        side = m.img_size * (8 if latent else 1)
        imgs = np.zeros((0, side, side, 3 if latent else m.in_chans), np.uint8)
    pieces = dist_env.gather_objects(env, imgs)
    result: dict = {}
    if env.is_main:
        order = np.concatenate([np.arange(r, n, env.world_size) for r in range(env.world_size)]).argsort()
        allimgs = np.concatenate(pieces)[order]
        how = f"atol{atol:g}-rtol{rtol:g}" if sampler == "dopri5" else f"{steps}steps"
        tag = f"{sampler}-{how}-cfg{cfg_scale:g}-n{n}-seed{seed}"
        npz, png = out_dir / f"samples_{tag}.npz", out_dir / f"samples_{tag}.png"
        save_npz(npz, allimgs)
        save_grid(allimgs, png)
        result = {"n": n, "sampler": sampler, "steps": steps, "nfe": info["nfe"], "cfg_scale": cfg_scale, "seed": seed,
                  "weights": "EMA" if use_ema and cfg.train.ema_decay > 0 else "raw", "world_size": env.world_size,
                  "clip_denoised": not latent and m.objective == "ddpm-eps",
                  **({"atol": atol, "rtol": rtol} if sampler == "dopri5" else {}),
                  "checkpoint": str(checkpoint), "alpha_min": m.alpha_min, "skips": m.skips,
                  "decoded_with_vae": vae if latent else None, "npz": str(npz), "png": str(png)}
        (out_dir / f"samples_{tag}.json").write_text(json.dumps(result, indent=2))
    # every rank ends the group together: a peer that tore its gloo connections down while rank 0 was still
    # writing made rank 0 abort at exit now and then ("terminate called without an active exception")
    dist_env.barrier(env)
    dist_env.cleanup(env)
    return result


def sample_command(checkpoint: str, labels: str | None = None, **options) -> None:
    """``resdecay sample``: ``--labels`` parsed, the samples drawn (``options``: the rest of
    ``run_sample``'s), one summary line printed on rank 0."""
    classes = None
    if labels:
        try:
            classes = [int(v) for v in labels.split(",")]
        except ValueError:
            raise UserError(f"--labels takes comma-separated class indices, got {labels!r}") from None
    r = run_sample(checkpoint, labels=classes, **options)
    if r:
        steps = (f"adaptive (atol {r['atol']:g}, rtol {r['rtol']:g}, at most {r['steps']} steps)" if r["sampler"] == "dopri5"
                 else f"{r['steps']} steps")
        print(f"{r['n']} samples | sampler {r['sampler']}, {steps}, {r['nfe']:g} network evaluations per batch, "
              f"guidance scale {r['cfg_scale']:g}, {r['weights']} weights, seed {r['seed']}\nwrote {r['png']} and {r['npz']}")
