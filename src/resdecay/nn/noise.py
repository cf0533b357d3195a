"""Where a training step's random draws come from: each rank's own generator (``train.noise_scope=rank``,
what DDP code does), or the whole effective batch's (``global``), so that a run's losses do not depend
on how many processes share the batch.

Under ``global`` every rank draws the masks / times / noise of the *whole* effective batch from a
generator seeded by (seed, step, micro-batch, draw) and keeps the rows of its own samples. The samplers
deal the global order out round-robin (rank r holds positions r, r + W, r + 2W, ...), so rank r keeps
rows ``r::W`` — the same rows whatever W is, as long as a micro-step holds the same images over all ranks
(and the accumulation is the same: each micro-batch draws apart). That is what makes a run saved on 4
processes and resumed on 2 (twice the per-rank batch) continue exactly.
The cost: each rank draws W times the numbers (masks and noise: negligible beside the forward).

The draws that go through here: MAE's masking noise, the diffusion time and noise, classifier-free
guidance's label drop. Dropout and stochastic depth stay per rank.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch


@dataclass
class GlobalNoise:
    seed: int
    step: int
    micro: int
    rank: int
    world: int
    draws: int = 0  # draws so far in this micro-batch: each gets its own seed


_ACTIVE: GlobalNoise | None = None


@contextlib.contextmanager
def global_batch_noise(seed: int, step: int, micro: int, rank: int, world: int):
    """The draws inside come from the effective batch's generator (see the module docstring)."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, GlobalNoise(seed, step, micro, rank, world)
    try:
        yield
    finally:
        _ACTIVE = previous


def active() -> bool:
    """Whether the draws now come from the effective batch's generator."""
    return _ACTIVE is not None


def draw(sample: Callable[[int], torch.Tensor], batch: int) -> torch.Tensor:
    """``sample(n)`` -> (n, ...) random rows, for this rank's ``batch`` samples: ``sample(batch)`` from the
    process's generator, or under ``global_batch_noise`` this rank's rows of the effective batch's draw."""
    scope = _ACTIVE
    if scope is None:
        return sample(batch)
    scope.draws += 1
    seed = int(np.random.SeedSequence([scope.seed, scope.step, scope.micro, scope.draws]).generate_state(1)[0])
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):  # the process's own generator continues untouched
        torch.manual_seed(seed)
        rows = sample(batch * scope.world)
    return rows[scope.rank:: scope.world]
