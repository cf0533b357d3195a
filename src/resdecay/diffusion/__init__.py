"""Diffusion objectives and samplers, kept apart from the backbones (DiT's split).

Backbones map ``model(x_t, t, y=None) -> prediction`` and carry ``model.cfg`` with ``objective``
("ddpm-eps" | "interp-v"), ``noise_schedule``, ``num_classes`` and ``class_dropout``; everything
about noise lives here: ``objectives`` (schedules, losses) and ``samplers`` (DDPM, DDIM,
DPM-Solver++ via diffusers; Euler, Heun, Euler-Maruyama for SiT's interpolant).
"""

from .objectives import (
    DDPM,
    NOISE_SCHEDULES,
    OBJECTIVES,
    LinearInterpolant,
    beta_schedule,
    cached_objective,
    diffusion_loss,
    model_config,
    objective_for,
    unwrap,
)
from .samplers import DEFAULT_SAMPLER, DEFAULT_STEPS, SAMPLERS, make_scheduler, sample, samplers_for, save_npz, to_uint8

__all__ = ["DDPM", "DEFAULT_SAMPLER", "DEFAULT_STEPS", "LinearInterpolant", "NOISE_SCHEDULES", "OBJECTIVES",
           "SAMPLERS", "beta_schedule", "cached_objective", "diffusion_loss", "make_scheduler", "model_config", "objective_for",
           "sample", "samplers_for", "save_npz", "to_uint8", "unwrap"]
