"""The decay schedule: how much of the identity shortcut each residual add keeps.

A decayed residual add is ``x <- alpha * x + f(x)`` (paper eq. 3): alpha scales the
identity path only, never the branch. This module is the one place where the alpha schedule
is computed; the shortcut formulas (``model.shortcut``: decay, learnable, scaled_sum, ...) and
the add itself live in ``resdecay.nn.residual``, and blocks, models, the CLI and the plots ask them.

Every schedule is returned as a ``(depth, 2)`` tensor: column 0 is the factor of the
attention sub-block of each transformer block, column 1 the factor of its MLP sub-block.

Schedules
---------
``"linear"`` (default, the authors' code)
    One factor per *sub-block*, ``linspace(1, alpha_min, 2 * depth)``: exactly 1.0 on the
    first attention add, exactly ``alpha_min`` on the last MLP add. This is what produced
    the paper's numbers (paper-notes §1) and what matches the alpha_eff binning of Table 2.
``"paper"``
    Paper eq. 5: one factor per *block*, ``alpha_l = 1 - l * (1 - alpha_min) / depth`` for
    ``l = 1 .. depth`` (so the first block already decays). A transformer block holds two
    residual adds; we put ``alpha_l`` on the attention add and 1.0 on the MLP add, so the
    block as a whole is ``x_{l+1} = alpha_l * x_l + f_l(x_l)`` exactly as in eq. 3 and
    ``effective_decay`` equals the paper's ``prod_l alpha_l``.
``"cosine"``
    Like ``"linear"`` but spaced by a half cosine, ``alpha_min + (1 - alpha_min) *
    (1 + cos(pi * k / (2 * depth - 1))) / 2`` (Table 3a's cosine scheduler).
``"constant"``
    Every sub-block uses ``alpha_min`` (the naive constant down-weighting).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

Schedule = Literal["linear", "paper", "cosine", "constant"]
Branches = Literal["both", "attn", "mlp"]
SCHEDULES, BRANCHES = get_args(Schedule), get_args(Branches)


def check_alpha_min(alpha_min: float, key: str = "model.alpha_min") -> None:
    """The one range check of alpha_min, for configs and for the functions below."""
    if isinstance(alpha_min, bool) or not isinstance(alpha_min, (int, float)) or not (0.0 < float(alpha_min) <= 1.0):
        raise ValueError(f"{key} must lie in (0, 1] (1 = plain residual), got {alpha_min!r}")


def _check(depth: int, alpha_min: float, schedule: str) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    check_alpha_min(alpha_min, "alpha_min")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")


def alpha_schedule(depth: int, alpha_min: float, schedule: str = "linear", branches: str = "both",
                   adds_per_block: int = 2) -> torch.Tensor:
    """Shortcut factors for a stack of ``depth`` residual blocks.

    Returns a float64 tensor of shape ``(depth, adds_per_block)``: for transformer blocks
    ``[:, 0]`` attention and ``[:, 1]`` MLP; ResNet blocks have one residual add
    (``adds_per_block=1``). ``branches="attn"`` or ``"mlp"`` keeps the schedule on that
    sub-block only and sets the other to 1 (Table 3b's "decay attention / MLP only").
    """
    _check(depth, alpha_min, schedule)
    if branches not in BRANCHES:
        raise ValueError(f"unknown branches {branches!r}; choose one of {', '.join(BRANCHES)}")
    if adds_per_block not in (1, 2):
        raise ValueError(f"adds_per_block must be 1 (ResNet blocks) or 2 (transformer blocks), got {adds_per_block}")
    if adds_per_block == 1 and branches != "both":
        raise ValueError("branches='attn'/'mlp' needs transformer blocks (adds_per_block=2)")
    table = _factors(depth, float(alpha_min), schedule, adds_per_block)
    if branches != "both":
        table[:, 1 if branches == "attn" else 0] = 1.0
    return table


def _factors(depth: int, a: float, schedule: str, per_block: int) -> torch.Tensor:
    n = per_block * depth  # residual adds, in order
    k = torch.arange(n, dtype=torch.float64, device="cpu")
    if schedule == "linear":
        # torch.linspace hits both ends exactly: 1.0 first, alpha_min last.
        flat = torch.linspace(1.0, a, n, dtype=torch.float64, device="cpu")
    elif schedule == "cosine":
        flat = a + (1.0 - a) * (1.0 + torch.cos(math.pi * k / (n - 1))) / 2.0
        flat[-1] = a  # exact end point despite cos(pi) rounding
    elif schedule == "constant":
        flat = torch.full((n,), a, dtype=torch.float64, device="cpu")
    else:  # "paper": eq. 5, one factor per block on its first add (the attention add)
        l = torch.arange(1, depth + 1, dtype=torch.float64, device="cpu")
        first = 1.0 - l * (1.0 - a) / depth
        first[-1] = a
        rest = [torch.ones_like(first)] * (per_block - 1)
        return torch.stack([first, *rest], dim=1)
    return flat.reshape(depth, per_block)


def effective_decay(alphas: torch.Tensor) -> float:
    """alpha_eff = product of every factor: how much of the input survives the identity path
    to the last block (paper §3, the quantity Table 2 bins into [1e-3, 1e-2))."""
    return float(torch.as_tensor(alphas, dtype=torch.float64, device="cpu").prod())


def solve_alpha_min(depth: int, target: float, schedule: str = "linear", tol: float = 1e-12) -> float:
    """The alpha_min whose schedule gives ``effective_decay == target``.

    alpha_eff grows monotonically with alpha_min for every schedule, from 0 (alpha_min -> 0)
    to 1 (alpha_min = 1), so bisection finds the unique answer for any target in (0, 1].
    """
    _check(depth, 1.0, schedule)
    if not isinstance(target, (int, float)) or not (0.0 < float(target) <= 1.0):
        raise ValueError(
            f"target alpha_eff {target!r} is unreachable: it must lie in (0, 1] "
            "(1 means no decay; the paper recommends 1e-3 to 1e-2)"
        )
    if float(target) == 1.0:
        return 1.0
    lo, hi = 1e-12, 1.0
    log_target = math.log(target)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if math.log(max(effective_decay(alpha_schedule(depth, mid, schedule)), 1e-300)) < log_target:
            lo = mid
        else:
            hi = mid
        if hi - lo < tol:
            break
    return 0.5 * (lo + hi)
