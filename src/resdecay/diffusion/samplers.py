"""Samplers: draw images from a trained backbone, with optional classifier-free guidance.

ddpm-eps models (objective DDPM, see objectives.py) use diffusers' schedulers built from the very
betas the DDPM objective trained with (``trained_betas=``, epsilon prediction, no clipping, since
the data may be latents):
  ddpm          ancestral sampling, DDPMScheduler (Ho et al. 2020; fixed_small variance), "trailing"
                spacing so the first step is t = T-1.
  ddim          DDIMScheduler, eta = 0 (Song et al. 2021). Its step size is T // steps, so the grid is
                r-1, 2r-1, ..., steps*r-1 (r = T // steps; == "trailing" when steps divides T) and the
                last step lands on ab = 1, i.e. returns x0.
  dpm-solver++  DPMSolverMultistepScheduler, algorithm "dpmsolver++", order 2, data prediction
                (Lu et al. 2022) -- U-ViT's sampler for its latent models, 50 steps (its pixel CIFAR models
                use Euler-Maruyama on a continuous VP-SDE instead; README, Diffusion).
interp-v models (SiT's linear interpolant x_t = (1-t) x0 + t eps, v = eps - x0, t: 1 -> 0), own code
on the uniform grid t_k = 1 - k/steps (the same convention as diffusers' FlowMatch schedulers,
sigma = t, shift 1; tests check ``euler`` against FlowMatchEulerDiscreteScheduler):
  euler          x <- x + (t' - t) v(x, t).
  heun           Heun's 2nd-order corrector; the last step (to t = 0) is Euler, as in EDM and
                 FlowMatchHeunDiscreteScheduler, because v(., 0) is ill-posed for data on a manifold.
  euler-maruyama SiT's SDE sampler. In SiT's derivation any diffusion D(t) >= 0 gives an SDE with the
                 same marginals as the ODE; in our reversed time (h = t - t' > 0):
                     x <- x - h v + h D(t) score + sqrt(2 D(t) h) z,   score = -(x + (1-t) v) / t,
                 with SiT's default D(t) = sigma_t = t, so h D score = -h eps_hat (finite at t = 1).
                 It runs from t = 1 to t_end = 0.04 (SiT's last_step_size) in steps-1 SDE steps, then one
                 Euler ODE step to 0, which is x0_hat = x - t v.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, UserError
from ..io import progress_bar
from .objectives import NUM_TIMESTEPS, LinearInterpolant, cached_objective, model_config

SAMPLERS: dict[str, str] = {  # sampler -> the objective it fits
    "ddpm": "ddpm-eps", "ddim": "ddpm-eps", "dpm-solver++": "ddpm-eps",
    "euler": "interp-v", "heun": "interp-v", "euler-maruyama": "interp-v", "dopri5": "interp-v",
}
# dpm-solver++: U-ViT's latent-space sampler (its CIFAR pixel configs sample a VP-SDE with Euler-Maruyama);
# for SiT the paper's FIDs (Table 4, 17.2 -> 11.8) were taken with SiT's dopri5 ODE sampler
DEFAULT_SAMPLER = {"ddpm-eps": "dpm-solver++", "interp-v": "dopri5"}
DEFAULT_STEPS = {"dpm-solver++": 50, "euler-maruyama": 250,  # U-ViT: 50 DPM-Solver steps; SiT: 250 SDE steps
                 "dopri5": 1000}  # dopri5: a cap on the adaptive solver's steps, not a step count
SDE_LAST_STEP = 0.04  # SiT's default last_step_size
ODE_ATOL, ODE_RTOL = 1e-6, 1e-3  # SiT's sample.py defaults for --sampling-method dopri5


def samplers_for(objective: str) -> list[str]:
    return [name for name, obj in SAMPLERS.items() if obj == objective]


def _diffusers():
    try:
        import diffusers
    except ImportError as exc:
        raise UserError(f"the ddpm/ddim/dpm-solver++ samplers need diffusers ({exc}); pip install diffusers") from None
    return diffusers


def _randn(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Gaussian noise drawn on the generator's device (so results do not depend on ``device``)."""
    if generator is None:
        return torch.randn(shape, device=device)
    return torch.randn(shape, generator=generator, device=generator.device).to(device)


def _guided(model, num_classes: int, y: torch.Tensor | None, scale: float):
    """f(x, t) -> model output; classifier-free guidance (Ho & Salimans 2022) when scale != 1:
    one pass on [x; x] with labels [y; null], out = uncond + scale * (cond - uncond).
    ``f.nfe`` counts the calls (network function evaluations)."""
    def f(x: torch.Tensor, t) -> torch.Tensor:
        f.nfe += 1
        tt = torch.as_tensor(t, dtype=torch.float32, device=x.device).expand(x.shape[0]).contiguous()
        if y is None:
            return model(x, tt).to(x.dtype)
        if scale == 1.0:
            return model(x, tt, y).to(x.dtype)
        null = torch.full_like(y, num_classes)
        cond, uncond = model(torch.cat([x, x]), torch.cat([tt, tt]), torch.cat([y, null])).to(x.dtype).chunk(2)
        return uncond + scale * (cond - uncond)
    f.nfe = 0
    return f


def _progress(seq, progress: bool, desc: str):
    if not progress:
        return seq
    return progress_bar(seq, desc=desc, leave=False)


# ------------------------------------------------------------------ ddpm-eps: diffusers schedulers
def make_scheduler(sampler: str, ddpm, steps: int, clip_denoised: bool = False):
    """The diffusers scheduler for ``sampler``, built from ``ddpm``'s float64 betas.

    ``clip_denoised``: clamp each step's predicted clean image to [-1, 1], as DDPM / DDIM do for
    pixel data (for DPM-Solver++ through its thresholding with sample_max_value 1, which then
    reduces to the same static clip). Off for latents, whose range is not [-1, 1]."""
    d = _diffusers()
    T = ddpm.num_timesteps
    common = dict(num_train_timesteps=T, trained_betas=ddpm.betas64, prediction_type="epsilon")
    if sampler == "ddpm":
        return d.DDPMScheduler(**common, variance_type="fixed_small", clip_sample=clip_denoised, clip_sample_range=1.0,
                               timestep_spacing="trailing")
    if sampler == "ddim":
        return d.DDIMScheduler(**common, clip_sample=clip_denoised, clip_sample_range=1.0, set_alpha_to_one=True,
                               timestep_spacing="leading", steps_offset=T // steps - 1)
    return d.DPMSolverMultistepScheduler(**common, algorithm_type="dpmsolver++", solver_order=2,
                                         lower_order_final=True, thresholding=clip_denoised, sample_max_value=1.0)


def _run_ddpm_family(sampler, f, x, steps, ddpm, generator, progress, clip_denoised=False):
    sched = make_scheduler(sampler, ddpm, steps, clip_denoised)
    with warnings.catch_warnings():  # diffusers' own numpy-2 DeprecationWarning in DPM-Solver set-up
        warnings.simplefilter("ignore", DeprecationWarning)
        sched.set_timesteps(steps, device=x.device)
    kwargs = {"generator": generator} if sampler == "ddpm" else {}
    x = x * sched.init_noise_sigma
    for t in _progress(sched.timesteps, progress, sampler):
        eps = f(x, t.float())
        x = sched.step(eps, t, x, **kwargs).prev_sample
    return x


# ------------------------------------------------------------------ interp-v: own ODE / SDE integrators
def _run_ode(sampler, f, x, steps, progress):
    ts = np.linspace(1.0, 0.0, steps + 1).tolist()
    for t, t_next in _progress(list(zip(ts[:-1], ts[1:], strict=True)), progress, sampler):
        v = f(x, t)
        x_next = x + (t_next - t) * v  # Euler
        if sampler == "heun" and t_next > 0:  # Heun's trapezoid corrector
            x_next = x + (t_next - t) * 0.5 * (v + f(x_next, t_next))
        x = x_next
    return x


def _run_dopri5(f, x, steps, atol, rtol):
    try:
        from torchdiffeq import odeint
    except ImportError as exc:
        raise UserError(f"the dopri5 sampler needs torchdiffeq ({exc}); pip install torchdiffeq") from None
    t = torch.tensor([1.0, 0.0], device=x.device)
    try:
        return odeint(lambda t, y: f(y, t), x, t, method="dopri5", atol=atol, rtol=rtol,
                      options={"max_num_steps": steps})[-1]
    except AssertionError as exc:
        if "max_num_steps" not in str(exc):
            raise
        raise UserError(f"dopri5 needed more than {steps} steps at atol {atol:g}, rtol {rtol:g}; raise --steps "
                        "(the step cap) or loosen --rtol/--atol") from None


def _run_sde(f, x, steps, generator, progress, t_end: float = SDE_LAST_STEP):
    ts = np.linspace(1.0, t_end, steps).tolist() if steps > 1 else [1.0]
    path = LinearInterpolant
    for t, t_next in _progress(list(zip(ts[:-1], ts[1:], strict=True)), progress, "euler-maruyama"):
        h = t - t_next
        v = f(x, t)
        eps_hat = path.velocity_to_eps(x, t, v)  # = -D(t) * score for D(t) = t
        x = x - h * (v + eps_hat) + math.sqrt(2 * t * h) * _randn(x.shape, generator, x.device)
    t = ts[-1]
    return path.velocity_to_x0(x, t, f(x, t))  # last Euler ODE step from t_end to 0


# ------------------------------------------------------------------ public entry point
def _check(cfg, sampler, steps, cfg_scale, labels, n, image_shape, batch_size, atol, rtol):
    if sampler not in SAMPLERS:
        raise ConfigError(f"unknown sampler {sampler!r}; choose one of {', '.join(SAMPLERS)}")
    if SAMPLERS[sampler] != cfg.objective:
        raise ConfigError(f"sampler {sampler!r} does not fit model.objective={cfg.objective}; use one of "
                          f"{', '.join(samplers_for(cfg.objective))}")
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"sampling steps must be an integer >= 1, got {steps!r}")
    if SAMPLERS[sampler] == "ddpm-eps" and steps > NUM_TIMESTEPS:
        raise ConfigError(f"{sampler} takes at most {NUM_TIMESTEPS} steps (the training "
                          f"timesteps), got {steps}; lower --steps")
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol > 0):
            raise ConfigError(f"{name} (dopri5's error tolerance) must be a positive number, got {tol!r}")
    if not math.isfinite(cfg_scale):
        raise ConfigError(f"cfg_scale must be a finite number, got {cfg_scale}")
    if cfg.num_classes == 0 and (labels is not None or cfg_scale != 1.0):
        raise UserError("class labels / cfg_scale != 1 were asked of a model that is unconditional "
                        "(model.num_classes=0); drop --guidance-scale/--labels")
    if cfg_scale != 1.0 and not cfg.class_dropout > 0:
        raise UserError(f"cfg_scale={cfg_scale}: guidance needs label dropout in training (model.class_dropout>0), "
                        "this model has class_dropout=0; use cfg_scale=1")
    if not isinstance(n, int) or n < 1:
        raise UserError(f"number of samples must be an integer >= 1, got {n!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise UserError(f"batch_size must be an integer >= 1 (or None for all at once), got {batch_size!r}")
    if len(tuple(image_shape)) != 3 or not all(isinstance(s, int) and s > 0 for s in image_shape):
        raise UserError(f"image_shape must be (C, H, W) of positive integers, got {tuple(image_shape)!r}")


def _labels(cfg, labels, n, generator) -> torch.Tensor | None:
    if cfg.num_classes == 0:
        return None
    if labels is None:  # random labels, drawn from the generator so sampling stays deterministic
        return torch.randint(0, cfg.num_classes, (n,), generator=generator,
                             device=generator.device if generator is not None else "cpu").cpu()
    y = torch.full((n,), int(labels), dtype=torch.long) if isinstance(labels, int) else torch.as_tensor(labels)
    if y.dtype.is_floating_point or y.dtype == torch.bool or y.shape != (n,):
        raise UserError(f"labels must be {n} integer class indices (or one int for all), got shape "
                        f"{tuple(y.shape)} dtype {y.dtype}")
    if len(y) and (y.min() < 0 or y.max() >= cfg.num_classes):
        raise UserError(f"labels must lie in 0..{cfg.num_classes - 1} (model.num_classes={cfg.num_classes}), "
                        f"got {int(y.min())}..{int(y.max())}")
    return y.long().cpu()


@torch.no_grad()
def sample(model, n: int, *, sampler: str, steps: int, cfg_scale: float = 1.0, labels=None,
           image_shape: tuple[int, int, int], generator: torch.Generator | None = None, device=None,
           batch_size: int | None = None, progress: bool = False, return_labels: bool = False,
           clip_denoised: bool = False, atol: float = ODE_ATOL, rtol: float = ODE_RTOL, info: dict | None = None):
    """``n`` samples (n, C, H, W) in the model's data range, from noise drawn with ``generator``.

    labels: None (conditional models: random labels from the generator), one int, or n ints.
    cfg_scale != 1 applies classifier-free guidance with the null label index model.num_classes.
    The same generator state gives the same samples (for a given batch_size and device).
    With return_labels=True returns (samples, labels or None). clip_denoised: clamp the predicted
    clean image to [-1, 1] at every step of the ddpm / ddim / dpm-solver++ samplers (pixel data).
    atol, rtol: dopri5's tolerances. ``info``, if a dict, receives "nfe": network evaluations per
    batch (mean over batches; a guided evaluation runs the network once on a doubled batch).
    """
    cfg = model_config(model)
    _check(cfg, sampler, steps, cfg_scale, labels, n, image_shape, batch_size, atol, rtol)
    if device is None:
        p = next(iter(model.parameters()), None)
        device = p.device if p is not None else torch.device("cpu")
    y_all = _labels(cfg, labels, n, generator)
    objective = cached_objective(cfg, device)
    bs = batch_size or n
    was_training = model.training
    model.eval()
    try:
        out, nfe = [], []
        for start in range(0, n, bs):
            m = min(bs, n - start)
            y = None if y_all is None else y_all[start:start + m].to(device)
            f = _guided(model, cfg.num_classes, y, float(cfg_scale))
            x = _randn((m, *image_shape), generator, device)
            if SAMPLERS[sampler] == "ddpm-eps":
                x = _run_ddpm_family(sampler, f, x, steps, objective, generator, progress, clip_denoised)
            elif sampler == "euler-maruyama":
                x = _run_sde(f, x, steps, generator, progress)
            elif sampler == "dopri5":
                x = _run_dopri5(f, x, steps, atol, rtol)
            else:
                x = _run_ode(sampler, f, x, steps, progress)
            out.append(x)
            nfe.append(f.nfe)
    finally:
        model.train(was_training)
    if info is not None:
        info["nfe"] = float(np.mean(nfe))
    samples = torch.cat(out)
    return (samples, y_all) if return_labels else samples


# ------------------------------------------------------------------ writing samples
def to_uint8(x: torch.Tensor) -> np.ndarray:
    """(N, C, H, W) data in [-1, 1] -> (N, H, W, C) uint8, DiT's mapping clamp(127.5 x + 128, 0, 255)."""
    if x.ndim != 4:
        raise UserError(f"to_uint8 expects images (N, C, H, W), got shape {tuple(x.shape)}")
    x = torch.clamp(127.5 * x.detach().float() + 128.0, 0, 255)
    return x.permute(0, 2, 3, 1).to("cpu", dtype=torch.uint8).numpy()


def save_npz(path, images: np.ndarray, labels=None) -> Path:
    """Write ADM's sample batch format: key "arr_0" = (N, H, W, C) uint8 (and "arr_1" = labels)."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise UserError(f"save_npz expects uint8 images (N, H, W, C) with C in (1, 3), got {images.dtype} "
                        f"{images.shape}; map with to_uint8 first")
    path = Path(path)
    if path.suffix != ".npz":  # np.savez would append it silently
        path = path.with_name(path.name + ".npz")
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {"arr_0": images}
    if labels is not None:
        arrays["arr_1"] = np.asarray(labels, dtype=np.int64)
    np.savez(path, **arrays)
    return path


__all__ = ["DEFAULT_SAMPLER", "DEFAULT_STEPS", "ODE_ATOL", "ODE_RTOL", "SAMPLERS", "make_scheduler", "sample", "samplers_for", "save_npz", "to_uint8"]
