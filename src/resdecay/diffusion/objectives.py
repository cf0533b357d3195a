"""Training objectives: what noise is added to the data and what the backbone must predict.

Following DiT's split, backbones know nothing about noise: they map ``model(x_t, t, y) -> same shape
as x_t``. This module owns the noise schedules and the losses; ``samplers.py`` integrates them back.

Two objectives, chosen by ``model.cfg.objective``:

* ``"ddpm-eps"`` -- DDPM (Ho et al. 2020) epsilon prediction, U-ViT's default. Discrete steps
  t in {0..T-1}, x_t = sqrt(ab_t) x0 + sqrt(1 - ab_t) eps with ab_t = prod_{s<=t} (1 - beta_s).
  The backbone sees t as a float in 0..T-1.
* ``"interp-v"`` -- SiT's (Ma et al. 2024) linear interpolant with velocity prediction, in the
  flow-matching convention of diffusers (sigma = t): t ~ U(0, 1), x_t = (1 - t) x0 + t eps,
  target v = dx_t/dt = eps - x0; t = 0 is data, t = 1 is pure noise. (SiT's own code runs time the
  other way, x_t = t x0 + (1 - t) eps; the two differ by t -> 1 - t and the sign of v.) The
  backbone sees the raw t in [0, 1], as SiT feeds it.

Label dropout for classifier-free guidance is applied inside the backbone in train mode (DiT's
LabelEmbedder), so the losses here pass labels through unchanged.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ConfigError, UserError, check_choice

# The only lists of objectives and noise schedules: model configs type their fields with these,
# so the config checker, the CLI and the objectives below agree.
Objective = Literal["ddpm-eps", "interp-v"]  # epsilon prediction under DDPM | velocity of the linear interpolant
NoiseSchedule = Literal["linear", "cosine", "scaled-linear"]
OBJECTIVES, NOISE_SCHEDULES = get_args(Objective), get_args(NoiseSchedule)
NUM_TIMESTEPS = 1000  # DDPM's T; every shipped model trains with it


def beta_schedule(name: str, num_timesteps: int = NUM_TIMESTEPS) -> np.ndarray:
    """DDPM betas as float64, shape (T,).

    linear: 1e-4 .. 0.02 (DDPM; ADM / U-ViT pixel default), scaled for T != 1000 as ADM does.
    cosine: improved DDPM (Nichol & Dhariwal 2021) ab(t) = cos((t/T + s)/(1 + s) * pi/2)^2, s = 0.008,
            beta_t = min(1 - ab(t+1)/ab(t), 0.999) -- diffusers' "squaredcos_cap_v2".
    scaled-linear: (linspace(sqrt 0.00085, sqrt 0.012))^2, Stable Diffusion's and U-ViT's latent schedule.
    """
    if not isinstance(num_timesteps, int) or num_timesteps < 1:
        raise ConfigError(f"num_timesteps must be a positive integer, got {num_timesteps!r}; use e.g. 1000")
    if name == "linear":
        scale = 1000 / num_timesteps
        return np.linspace(scale * 1e-4, scale * 0.02, num_timesteps, dtype=np.float64)
    if name == "cosine":
        def ab(t: float) -> float:
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        T = num_timesteps
        return np.array([min(1 - ab((i + 1) / T) / ab(i / T), 0.999) for i in range(T)], dtype=np.float64)
    if name == "scaled-linear":
        return np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, num_timesteps, dtype=np.float64) ** 2
    raise ConfigError(f"noise schedule {name!r} is unknown; choose one of {', '.join(NOISE_SCHEDULES)}")


def _bcast(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B,) -> (B, 1, 1, ...) matching ``like``'s rank and dtype."""
    return v.reshape(-1, *([1] * (like.ndim - 1))).to(like.dtype)


def _call(model, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
    return model(x, t) if y is None else model(x, t, y)


class DDPM(nn.Module):
    """DDPM forward process and the simple epsilon loss (Ho et al. 2020, eq. 14 "L_simple")."""

    def __init__(self, noise_schedule: str = "linear", num_timesteps: int = NUM_TIMESTEPS):
        super().__init__()
        self.noise_schedule, self.num_timesteps = noise_schedule, num_timesteps
        # float64 copies (numpy) for building samplers from exactly the same betas ...
        self.betas64 = beta_schedule(noise_schedule, num_timesteps)
        self.alphas_cumprod64 = np.cumprod(1.0 - self.betas64)
        ab = self.alphas_cumprod64
        # ... and float32 buffers (computed in float64, then cast) that follow the module's device.
        for key, value in (("betas", self.betas64), ("alphas_cumprod", ab),
                           ("sqrt_alphas_cumprod", np.sqrt(ab)), ("sqrt_one_minus_alphas_cumprod", np.sqrt(1 - ab))):
            self.register_buffer(key, torch.from_numpy(value).float(), persistent=False)

    def q_sample(self, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """x_t = sqrt(ab_t) x0 + sqrt(1 - ab_t) eps for integer steps t (B,)."""
        t = t.long().to(x0.device)  # buffers follow x0 too, should this object live on another device
        a, s = self.sqrt_alphas_cumprod.to(x0.device)[t], self.sqrt_one_minus_alphas_cumprod.to(x0.device)[t]
        return _bcast(a, x0) * x0 + _bcast(s, x0) * noise

    def sample_t(self, batch: int, device) -> torch.Tensor:
        return torch.randint(0, self.num_timesteps, (batch,), device=device)

    def noised_at_level(self, x0: torch.Tensor, noise: torch.Tensor, level: float):
        """(x_t, t) at a fraction ``level`` in [0, 1] of the diffusion time: t = round(level (T-1)).
        Level 0 returns x0 itself (t = 0), level 1 the last step t = T-1. t is (B,) float, as the model takes it."""
        step = round(float(level) * (self.num_timesteps - 1))
        t = torch.full((x0.shape[0],), step, device=x0.device, dtype=torch.long)
        return (x0 if level == 0 else self.q_sample(x0, t, noise)), t.float()

    def loss(self, model, x0: torch.Tensor, y: torch.Tensor | None = None, *,
             t: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
        """MSE between model(x_t, t, y) and eps; t ~ U{0..T-1}, eps ~ N(0, I) unless given."""
        t = self.sample_t(x0.shape[0], x0.device) if t is None else t.to(x0.device).long()
        noise = torch.randn_like(x0) if noise is None else noise
        pred = _call(model, self.q_sample(x0, t, noise), t.float(), y)
        return F.mse_loss(pred.float(), noise.float())


class LinearInterpolant(nn.Module):
    """SiT's linear path, velocity prediction, time convention x_t = (1 - t) x0 + t eps (t=1: noise).

    Conversions from a velocity v(x_t, t) (all exact for this path):
      x0_hat  = x_t - t v                       (follow the straight line back to t = 0)
      eps_hat = x_t + (1 - t) v                 (and forward to t = 1)
      score   = -eps_hat / t = -(x_t + (1 - t) v) / t   (Gaussian conditional, sigma_t = t)
    """

    def sample_t(self, batch: int, device) -> torch.Tensor:
        return torch.rand(batch, device=device)

    def noised_at_level(self, x0: torch.Tensor, noise: torch.Tensor, level: float):
        """(x_t, t) at t = ``level`` in [0, 1] (0 = x0, 1 = pure noise); t is (B,) float."""
        t = torch.full((x0.shape[0],), float(level), device=x0.device)
        return self.interpolate(x0, t, noise), t

    @staticmethod
    def interpolate(x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        t = _bcast(t, x0)
        return (1 - t) * x0 + t * noise

    @staticmethod
    def target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return noise - x0

    @staticmethod
    def velocity_to_x0(x: torch.Tensor, t, v: torch.Tensor) -> torch.Tensor:
        return x - t * v

    @staticmethod
    def velocity_to_eps(x: torch.Tensor, t, v: torch.Tensor) -> torch.Tensor:
        return x + (1 - t) * v

    def loss(self, model, x0: torch.Tensor, y: torch.Tensor | None = None, *,
             t: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
        """MSE between model(x_t, t, y) and v = eps - x0; t ~ U(0, 1), eps ~ N(0, I) unless given."""
        t = self.sample_t(x0.shape[0], x0.device) if t is None else t.to(x0.device).float()
        noise = torch.randn_like(x0) if noise is None else noise
        pred = _call(model, self.interpolate(x0, t, noise), t, y)
        return F.mse_loss(pred.float(), self.target(x0, noise).float())


def unwrap(model):
    """The backbone inside DDP (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    for _ in range(8):
        if hasattr(model, "cfg"):
            return model
        inner = getattr(model, "_orig_mod", None)
        inner = getattr(model, "module", None) if inner is None else inner
        if inner is None:
            break
        model = inner
    raise UserError(f"{type(model).__name__} has no .cfg with the diffusion fields (objective, noise_schedule, "
                    "num_classes, class_dropout); pass a diffusion backbone (SiT / U-ViT)")


def model_config(model):
    """``model.cfg`` of a (possibly wrapped) backbone, checked for the fields this package reads."""
    cfg = unwrap(model).cfg
    missing = [k for k in ("objective", "noise_schedule", "num_classes", "class_dropout") if not hasattr(cfg, k)]
    if missing:
        raise UserError(f"model.cfg lacks {', '.join(missing)}; this model is not a diffusion backbone (SiT / U-ViT)")
    check_choice(cfg.objective, OBJECTIVES, "model.objective")
    return cfg


def objective_for(cfg, device=None) -> DDPM | LinearInterpolant:
    """The objective object a model config asks for (a new one; see ``cached_objective``)."""
    check_choice(cfg.objective, OBJECTIVES, "model.objective")
    if cfg.objective == "ddpm-eps":
        obj = DDPM(cfg.noise_schedule)
    else:
        if cfg.noise_schedule != "linear":
            raise ConfigError(f"model.objective=interp-v implements SiT's linear path only, got "
                              f"model.noise_schedule={cfg.noise_schedule!r}; set model.noise_schedule=linear")
        obj = LinearInterpolant()
    return obj.to(device) if device is not None else obj


_CACHE: dict[tuple, nn.Module] = {}


def cached_objective(cfg, device) -> DDPM | LinearInterpolant:
    """``objective_for`` memoised per (objective, noise_schedule, device)."""
    key = (cfg.objective, cfg.noise_schedule, str(torch.device(device)))
    if key not in _CACHE:
        _CACHE[key] = objective_for(cfg, device)
    return _CACHE[key]


def diffusion_loss(model, images: torch.Tensor, labels: torch.Tensor | None = None, *,
                   t: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
    """The training loop's loss: (model, images, labels) -> scalar, objective read from ``model.cfg``.

    ``model`` may be wrapped (DDP, torch.compile); it is called as given so DDP still syncs grads.
    Labels are passed only to class-conditional models (cfg.num_classes > 0); ``t`` and ``noise`` (drawn
    here when None) as the objective's ``loss`` takes them.
    """
    cfg = model_config(model)
    y = labels if cfg.num_classes > 0 else None
    if cfg.num_classes > 0 and labels is None:
        raise UserError(f"model is class-conditional (model.num_classes={cfg.num_classes}) but the batch has no "
                        "labels; use a labelled dataset or set model.num_classes=0")
    return cached_objective(cfg, images.device).loss(model, images, y, t=t, noise=noise)


__all__ = ["DDPM", "LinearInterpolant", "NOISE_SCHEDULES", "NUM_TIMESTEPS", "NoiseSchedule", "OBJECTIVES", "Objective", "beta_schedule", "cached_objective",
           "diffusion_loss", "model_config", "objective_for", "unwrap"]
