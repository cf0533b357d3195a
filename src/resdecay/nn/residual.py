"""The residual add, in one place: ``alpha * x + beta * f(x)``, and the registry of shortcut formulas
that choose alpha (the identity path's factor) and beta (the branch's) for every residual add.

One add, three forms
--------------------
``residual_add(x, f, alpha, beta)``
    The add itself; our blocks (``Block``, ``AdaLNBlock``) call it. Paper eq. 3 is beta = 1.
``residual_correction(x, f, alpha, beta)``
    For a block that adds ``x + out`` itself (timm's ViT block, which ``decayify`` hooks): the ``out``
    to hand it, so that its own ``x + out`` is ``alpha * x + beta * f``.
``scale_identity(x, alpha)`` and ``scale_branch(f, beta)``
    For a block whose ``relu(branch + identity)`` cannot be reached between the two (torchvision's
    ResNet blocks): each path scaled on its own before the block adds them.

Shortcut formulas (``model.shortcut``; paper Table 3)
-----------------------------------------------------
A formula is one function registered by name::

    @register_shortcut("two_minus")
    def two_minus(depth, alpha_min, schedule, adds_per_block):
        alphas = alpha_schedule(depth, alpha_min, schedule, adds_per_block=adds_per_block)
        return alphas, 2.0 - alphas  # x * alpha + f * (2 - alpha)

It returns (alphas, betas), each broadcastable to ``(depth, adds_per_block)`` (column 0 the
attention add of a transformer block, column 1 its MLP add; a ResNet block has one add).
``model.decay_branches`` (attn | mlp) is applied here, once, for every formula: the sub-block it
does not name keeps the plain ``x + f``, so no formula can silently ignore it. A formula registered
with ``learnable=True`` gives alpha's *initial* value; the blocks then train it. Every model config
checks ``model.shortcut`` against this registry, so a formula registered in a user's file is a valid
setting everywhere.

Built-ins: ``decay`` (the method), ``learnable`` (Table 3a / Table 5), ``scaled_sum`` and
``scaled_branch`` (Table 3b). The alpha schedule itself lives in ``resdecay.schedule``; how a run
names its formula (``decay linear alpha_min 0.6``, ``scaled_sum``, ``... (plugin)``) in ``nn.shortcut_info``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.nn as nn

from ..errors import ConfigError, Registry, defined_at, one_line
from ..schedule import BRANCHES, alpha_schedule, check_alpha_min
from .updates import RESIDUAL_UPDATES, Update, update_named


# ----------------------------------------------------------------------------- the add
def residual_add(x: torch.Tensor, branch: torch.Tensor, alpha: float | torch.Tensor, beta: float = 1.0,
                 update: Update | None = None) -> torch.Tensor:
    """``alpha * x + beta * branch``: alpha scales the identity path, beta the branch.

    For a fixed alpha, ``torch.add(branch, x, alpha=alpha)`` is one fused multiply-add kernel in
    the forward pass, the same cost as a plain ``x + branch``; the backward pass adds one
    elementwise scale of the identity gradient (within noise on CPU; +2.7-2.9% of an eager bf16
    ViT-B block on an H100, +2.0-4.1% on an H200; compiled, within 0.4%: benchmarks/block_overhead.py).
    A tensor alpha (a learnable formula) takes the autograd path. beta != 1 scales the branch
    first (the Table 3b variants). ``update(x, branch)`` (``nn.updates``: the orthogonal update) replaces the
    branch before the add; None (every formula but those naming an update) leaves it as it is.
    """
    if update is not None:
        branch = update(x, branch)
    if ADD_TAPS:  # the residual-stream diagnostics read (and may zero) the add here; empty otherwise
        return ADD_TAPS[-1](x, branch, alpha, beta, side_add)
    return side_add(x, branch, alpha, beta)


def side_add(x: torch.Tensor, branch: torch.Tensor, alpha: float | torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """``residual_add`` for an add outside the stream a model's blocks carry (an MM-DiT's text stream): the same
    arithmetic, never read by the diagnostics' tap."""
    branch = scale_branch(branch, beta)
    if isinstance(alpha, torch.Tensor):
        return branch + alpha * x
    if alpha == 1.0:
        return x + branch
    return torch.add(branch, x, alpha=alpha)


# ``tap(x, branch, alpha, beta, add) -> output`` while the diagnostics record a forward (stream/record.py):
# every ``residual_add`` of resdecay's blocks and of the adapters' replaced forwards is one add of the stream
ADD_TAPS: list[Callable] = []

decayed_add = residual_add  # the older name (``resdecay.decayed_add``), kept for callers; the same function


def residual_correction(x: torch.Tensor, branch: torch.Tensor, alpha: float, beta: float = 1.0,
                        update: Update | None = None) -> torch.Tensor:
    """What a block that computes ``x + out`` itself must be given as ``out`` so that the sum is
    ``residual_add(x, branch, alpha, beta, update)``: ``beta * u(x, branch) - (1 - alpha) * x`` (equal up to
    float rounding, since the block's own add comes last; u is the identity when ``update`` is None)."""
    if update is not None:
        branch = update(x, branch)
    return scale_branch(branch, beta) - (1.0 - alpha) * x


def scale_identity(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """The identity path of a block whose add cannot be reached (a ResNet block): ``alpha * x``."""
    return x * alpha


def scale_branch(branch: torch.Tensor, beta: float) -> torch.Tensor:
    """The branch path, ``beta * f`` (untouched for beta = 1, so the plain add is bit-exact)."""
    return branch if beta == 1.0 else branch * beta


class ShortcutScale(nn.Module):
    """Parameter-free ``x -> alpha * x`` for a ResNet block's identity path (put in the empty
    ``downsample`` place by ``decayify``)."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scale_identity(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4f}"


# ----------------------------------------------------------------------------- factors on a block
def scalar(a: float | torch.Tensor) -> float:
    """A shortcut factor as a Python float, fixed or learnable."""
    return float(a.detach()) if isinstance(a, torch.Tensor) else float(a)


class BlockFactors(NamedTuple):
    """A two-add block's factors as numbers: ``alphas = (attn, mlp)``, ``betas = (attn, mlp)``."""

    alphas: tuple[float, float]
    betas: tuple[float, float]


def set_block_factors(block: nn.Module, alpha_attn: float = 1.0, alpha_mlp: float = 1.0, beta_attn: float = 1.0,
                      beta_mlp: float = 1.0, learnable_alpha: bool | tuple[bool, bool] = False,
                      update: str | None = None) -> None:
    """Put a two-add block's factors where its forward (``residual_add``) and ``factors_of`` read them.

    Args:
        block: a ``Block`` or ``AdaLNBlock``.
        alpha_attn, alpha_mlp: identity factors of the attention / MLP add.
        beta_attn, beta_mlp: branch factors.
        learnable_alpha: train alpha (one bool for both adds, or one per add). A trained alpha is an
            ``nn.Parameter`` (a state_dict entry); a fixed one a plain float the config records.
        update: a registered residual update both adds apply (``nn.updates``), or None.
    """
    learn_attn, learn_mlp = (learnable_alpha, learnable_alpha) if isinstance(learnable_alpha, bool) else learnable_alpha
    block.alpha_attn = nn.Parameter(torch.tensor(float(alpha_attn))) if learn_attn else float(alpha_attn)
    block.alpha_mlp = nn.Parameter(torch.tensor(float(alpha_mlp))) if learn_mlp else float(alpha_mlp)
    block.beta_attn, block.beta_mlp = float(beta_attn), float(beta_mlp)
    block.update, block.update_fn = update, update_named(update)  # the name (its repr), the function (its forward)


def factors_of(block: nn.Module) -> BlockFactors:
    """The factors a two-add block uses now (learnable ones at their current value): what the norm
    statistics, ``alphas_of`` and the reprs read."""
    return BlockFactors((scalar(block.alpha_attn), scalar(block.alpha_mlp)), (block.beta_attn, block.beta_mlp))


def factors_repr(block: nn.Module) -> str:
    """``alpha_attn=..., alpha_mlp=...`` (+ the betas where not 1): a block's ``extra_repr``."""
    (a_attn, a_mlp), (b_attn, b_mlp) = factors_of(block)
    beta = f", beta_attn={b_attn:.4f}, beta_mlp={b_mlp:.4f}" if (b_attn, b_mlp) != (1.0, 1.0) else ""
    update = f", update={block.update}" if getattr(block, "update", None) else ""
    return f"alpha_attn={a_attn:.4f}, alpha_mlp={a_mlp:.4f}{beta}{update}"


# ----------------------------------------------------------------------------- the formula registry
Formula = Callable[[int, float, str, int], tuple]


@dataclass(frozen=True)
class ShortcutFormula:
    """One registered ``model.shortcut``: its table function, whether alpha is trained, and the residual update
    its adds apply to the branch (``nn.updates``; None: the branch as it is)."""

    name: str
    factors: Formula  # (depth, alpha_min, schedule, adds_per_block) -> (alphas, betas)
    learnable: bool = False
    update: str | None = None


SHORTCUT_FORMULAS: dict[str, ShortcutFormula] = {}
_FORMULAS = Registry("shortcut formula", "register_shortcut", SHORTCUT_FORMULAS,
                     origin=lambda f: f"by {defined_at(f.factors)}", same=lambda old, new: old.factors is new.factors)


def register_shortcut(name: str, *, learnable: bool = False, update: str | None = None,
                      replace: bool = False) -> Callable[[Formula], Formula]:
    """Register a shortcut formula under ``name`` (the ``model.shortcut`` value); a decorator.

    Args:
        name: the setting's value; a name another function holds is refused (``RegistryError``, one line).
        learnable: alpha is trained, starting from the formula's alphas (the blocks hold it as a parameter).
        update: a registered residual update (``nn.updates.register_update``) every add applies to its branch:
            ``alpha * x + beta * update(x, f)``.
        replace: replace the formula registered under ``name`` (e.g. a plugin re-imported in a notebook).

    The formula is called on the CPU (under ``torch.device("cpu")``, also while a model is being built
    on the meta device), so ``torch.arange(n)`` without ``device=`` is fine; it may return floats,
    lists, numpy arrays or tensors of any dtype (converted to float64). An exception it raises is
    reported as one line naming the formula and its file.
    """
    if update is not None and update not in RESIDUAL_UPDATES:
        raise ConfigError(f"shortcut formula {name!r}: update {update!r} is not registered; choose one of "
                          f"{', '.join(RESIDUAL_UPDATES)} (or register yours with resdecay.nn.updates.register_update)")

    def add(fn: Formula) -> Formula:
        _FORMULAS.add(name, ShortcutFormula(name, fn, learnable, update), replace)
        return fn
    return add


def unregister_shortcut(name: str) -> ShortcutFormula:
    """Remove the formula registered under ``name`` (``RegistryError`` if there is none); returns it."""
    return _FORMULAS.remove(name)


def shortcut_names() -> tuple[str, ...]:
    """The registered ``model.shortcut`` values, in registration order."""
    return tuple(SHORTCUT_FORMULAS)


def check_shortcut(shortcut: str, branches: str = "both", adds_per_block: int = 2, fixed_by: str | None = None,
                   keys: tuple[str, str] = ("model.shortcut", "model.decay_branches"),
                   feature_maps: bool = False) -> ShortcutFormula:
    """The registered formula ``shortcut``, or a one-line ConfigError naming the fix.

    Args:
        shortcut: a registered formula's name.
        branches: both | attn | mlp, the sub-blocks the formula applies to.
        adds_per_block: 2 for transformer blocks, 1 for ResNet blocks (which have no attn/mlp to pick).
        fixed_by: what holds the factors when they must be fixed numbers (e.g. decayify's hooks);
            learnable formulas are then refused. None: a learnable alpha can be held.
        keys: the two settings' names as the caller's user writes them.
        feature_maps: the blocks add (B, C, H, W) feature maps (a ResNet), where a residual update of token
            streams (``nn.updates``) has no per-token meaning: a formula naming one is refused.
    """
    skey, bkey = keys
    if shortcut not in SHORTCUT_FORMULAS:
        raise ConfigError(f"{skey} {shortcut!r} is unknown; choose one of {', '.join(shortcut_names())} "
                          "(or register yours with resdecay.register_shortcut)")
    if branches not in BRANCHES:
        raise ConfigError(f"{bkey} {branches!r} is unknown; choose one of {', '.join(BRANCHES)}")
    if feature_maps and SHORTCUT_FORMULAS[shortcut].update is not None:
        raise ConfigError(f"{skey}={shortcut} updates the branch of a token stream; these blocks add feature maps "
                          "(ResNet): use a formula without an update (decay, scaled_sum, ...)")
    if adds_per_block == 1 and branches != "both":
        raise ConfigError(f"{bkey}={branches} picks a transformer sub-block, but these blocks have one residual add "
                          f"(ResNet); use {bkey}=both")
    formula = SHORTCUT_FORMULAS[shortcut]
    if formula.learnable and fixed_by is not None:
        fixed = [n for n, f in SHORTCUT_FORMULAS.items() if not f.learnable]
        raise ConfigError(f"{skey}={shortcut} trains alpha, but {fixed_by} holds fixed factors only; "
                          f"use one of {', '.join(fixed)}")
    return formula


@dataclass(frozen=True)
class ShortcutPlan:
    """Every residual add's factors for a stack of blocks, each a ``(depth, adds_per_block)`` table."""

    alphas: torch.Tensor  # float64: identity factors (a learnable alpha's initial value)
    betas: torch.Tensor  # float64: branch factors
    learnable: torch.Tensor  # bool: alpha is trained
    update: str | None = None  # the residual update every add applies (``nn.updates``)

    def block_kwargs(self) -> list[dict]:
        """Per two-add block, the keyword arguments of ``Block`` / ``AdaLNBlock``."""
        extra = {} if self.update is None else {"update": self.update}
        return [dict(alpha_attn=a[0], alpha_mlp=a[1], beta_attn=b[0], beta_mlp=b[1], learnable_alpha=(la, lm), **extra)
                for a, b, (la, lm) in zip(self.alphas.tolist(), self.betas.tolist(), self.learnable.tolist(), strict=True)]


def formula_source(formula: ShortcutFormula) -> str:
    """Where a formula is defined, for error lines: its file (a plugin's path) and function name."""
    code = getattr(formula.factors, "__code__", None)
    where = code.co_filename if code is not None else getattr(formula.factors, "__module__", "?")
    return f"{where} ({getattr(formula.factors, '__qualname__', formula.name)})"


def _table(value, depth: int, adds: int, what: str, formula: ShortcutFormula) -> torch.Tensor:
    try:
        if isinstance(value, torch.Tensor):  # any device, any dtype: a plain float64 CPU copy
            value = value.detach().to("cpu")
        t = torch.as_tensor(value, dtype=torch.float64, device="cpu")
    except (TypeError, ValueError, RuntimeError) as e:
        raise ConfigError(f"shortcut formula {formula.name!r} in {formula_source(formula)} returned {what} that is "
                          f"not a number or a table of numbers ({type(e).__name__}: {one_line(e)}); return floats, "
                          "lists or tensors") from None
    try:
        return t.expand(depth, adds).clone()
    except RuntimeError:
        raise ConfigError(f"shortcut formula {formula.name!r} in {formula_source(formula)} returned {what} of shape "
                          f"{tuple(t.shape)}; expected ({depth}, {adds}) or a shape that broadcasts to it") from None


def evaluate_formula(formula: ShortcutFormula, depth: int, alpha_min: float, schedule: str,
                     adds_per_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A formula's (alphas, betas) as ``(depth, adds_per_block)`` float64 CPU tensors.

    The formula runs under ``torch.device("cpu")``: models are also built inside
    ``torch.device("meta")`` (parameter counts, ``from_pretrained``'s shape check), and a formula
    written as a newcomer writes it (``torch.arange(n)``, no ``device=``) would otherwise make meta
    tensors whose values cannot be read. A formula that raises is one line naming it and its file.
    """
    try:
        with torch.device("cpu"):
            result = formula.factors(depth, alpha_min, schedule, adds_per_block)
        alphas, betas = result
    except Exception as e:  # a plugin's own bug: name the formula and its file, keep it to one line
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"shortcut formula {formula.name!r} in {formula_source(formula)} failed: "
                          f"{type(e).__name__}: {one_line(e)}; fix the formula (it must return (alphas, betas))") from None
    return (_table(alphas, depth, adds_per_block, "alphas", formula),
            _table(betas, depth, adds_per_block, "betas", formula))


def shortcut_plan(depth: int, alpha_min: float, schedule: str = "linear", branches: str = "both",
                  shortcut: str = "decay", adds_per_block: int = 2) -> ShortcutPlan:
    """The factors of ``depth`` blocks under a registered formula, with ``branches`` applied.

    Args:
        depth: blocks in the stack.
        alpha_min: the schedule's last factor, in (0, 1].
        schedule: linear | paper | cosine | constant (``resdecay.schedule``).
        branches: both | attn | mlp; the sub-block not named keeps the plain ``x + f``.
        shortcut: a registered formula (``shortcut_names()``).
        adds_per_block: 2 for transformer blocks, 1 for ResNet blocks.
    """
    formula = check_shortcut(shortcut, branches, adds_per_block, keys=("shortcut", "branches"))
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    if adds_per_block not in (1, 2):
        raise ValueError(f"adds_per_block must be 1 (ResNet blocks) or 2 (transformer blocks), got {adds_per_block}")
    check_alpha_min(alpha_min, "alpha_min")
    alphas, betas = evaluate_formula(formula, depth, alpha_min, schedule, adds_per_block)
    trained = torch.full((depth, adds_per_block), formula.learnable, dtype=torch.bool, device="cpu")  # CPU also under torch.device("meta")
    if branches != "both":  # the other sub-block is plain: x + f, never trained
        other = 1 if branches == "attn" else 0
        alphas[:, other], betas[:, other], trained[:, other] = 1.0, 1.0, False
    return ShortcutPlan(alphas, betas, trained, formula.update)


def shortcut_factors(depth: int, alpha_min: float, schedule: str = "linear", branches: str = "both",
                     shortcut: str = "decay", adds_per_block: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """(alphas, betas), each ``(depth, adds_per_block)`` float64: block adds are ``alpha * x + beta * f(x)``
    (``shortcut_plan`` without the learnable mask)."""
    plan = shortcut_plan(depth, alpha_min, schedule, branches, shortcut, adds_per_block)
    return plan.alphas, plan.betas


# ----------------------------------------------------------------------------- the built-in formulas
@register_shortcut("decay")
def decay(depth: int, alpha_min: float, schedule: str, adds_per_block: int):
    """The method (paper eq. 3): alpha follows the schedule from 1 to alpha_min; the branch as it is."""
    return alpha_schedule(depth, alpha_min, schedule, adds_per_block=adds_per_block), 1.0


@register_shortcut("learnable", learnable=True)
def learnable(depth: int, alpha_min: float, schedule: str, adds_per_block: int):
    """Table 3a / Table 5: alpha starts at 1 and is trained, one scalar per add; beta = 1."""
    return 1.0, 1.0


@register_shortcut("scaled_sum")
def scaled_sum(depth: int, alpha_min: float, schedule: str, adds_per_block: int):
    """Table 3b: ``sqrt(0.5) * (x + f)`` at every add."""
    return math.sqrt(0.5), math.sqrt(0.5)


@register_shortcut("scaled_branch")
def scaled_branch(depth: int, alpha_min: float, schedule: str, adds_per_block: int):
    """Table 3b: ``x + sqrt(0.5) * f`` at every add."""
    return 1.0, math.sqrt(0.5)


@register_shortcut("orthogonal", update="orthogonal")
def orthogonal(depth: int, alpha_min: float, schedule: str, adds_per_block: int):
    """The orthogonal residual update (``nn.updates``): ``x + (f - proj_x f)`` per token; no decay."""
    return 1.0, 1.0


@register_shortcut("orthogonal_decay", update="orthogonal")
def orthogonal_decay(depth: int, alpha_min: float, schedule: str, adds_per_block: int):
    """The decay and the orthogonal update together: ``alpha_l * x + (f - proj_x f)``, alpha as ``decay``'s."""
    return alpha_schedule(depth, alpha_min, schedule, adds_per_block=adds_per_block), 1.0
