"""``decayify``: put decayed identity shortcuts into models people already have, by composition.

Residual blocks are found in ``model.modules()`` order (depth order) through the block-adapter
registry (``resdecay.nn.adapters``; the models each adapter is tested on: docs/coverage.md, generated from the
tests, the one list). Each adapter reaches its
block's adds in one of four ways (``adapters.hooks``, ``adapters.fused``): where the block's forward traces
and its stated roles are proved there, a forward generated from the trace with each add one fused
``torch.add(f, x, alpha=alpha)``; else a pre-hook keeping the sub-block input x and a
hook returning ``residual_correction`` on the module the block adds; a scaled identity path
(``downsample`` / ``shortcut``, or a parameter-free ``ShortcutScale`` in its empty place); or, where
the add is inline with a gate (adaLN-Zero), a replaced forward equal to the library's at alpha = 1.

The factors come from the shortcut formula registry (``shortcut``, default ``"decay"``) and every
form of the add is ``resdecay.nn.residual``'s. Formulas that train alpha are refused: a hook holds
fixed numbers.

No class is subclassed or swapped, no parameter is added or renamed: the state_dict keys are the
model's own, so pretrained weights load unchanged, and with alpha_min = 1 the hooks are not even
installed, so outputs are exactly the original model's. The settings are recorded on the model
as ``model.resdecay_spec`` (``resdecay.save_decayified`` stores it beside the weights and
``resdecay.load_decayified`` re-applies it); a transformers / diffusers model also records them in its own
config (``model.config.resdecay``, ``resdecay.nn.config_record``), so the library's ``save_pretrained``
keeps them and ``resdecay.interop.restore`` re-applies them after its ``from_pretrained``. The spec is the *structure* only (alpha_min,
schedule, branches, and shortcut where it is not "decay"): ``zero_init`` is an initialisation
done once, when asked for, and is never recorded, so ``decayify(model, **model.resdecay_spec)`` on trained weights leaves them as they are.

Modules no registered adapter takes (the repeated modules of a stack, classes named like residual
blocks) are tried by the traced adapter (``adapters.traced``): torch.fx traces the block, and each residual
add it proves is reached by the same hooks or by a forward generated from the graph; ``residual_blocks``
names such blocks "traced <ClassName>". Residual blocks of other kinds (a hybrid timm model's ResNet stem,
a block the traced adapter refuses) are left at alpha 1; ``decayify`` says so in one ``PartialDecayWarning``
naming them, with the traced adapter's reason.
"""

from __future__ import annotations

import re
import warnings

import torch.nn as nn

from ..errors import check_choice
from .adapters import adapter_for, adapters, nearest_supported
from .adapters.depth_order import depth_order_for
from .adapters.hooks import remove as _remove_hooks
from .adapters.hooks import unguard
from .adapters.registry import BlockAdapter
from .adapters.traced import trace_blocks
from .config_record import recorder
from .residual import SHORTCUT_FORMULAS, ShortcutScale, check_shortcut, factors_of, shortcut_plan  # noqa: F401  (ShortcutScale: public here before)


def supported() -> list[str]:
    """The names of the block kinds ``decayify`` takes (the registered adapters)."""
    return [a.name for a in adapters()]


SUPPORTED = tuple(supported())  # the built-in kinds; ``supported()`` also lists those registered later


def residual_blocks(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, block, adapter name) of every residual block ``decayify`` decays, in depth order (a registered
    ``DepthOrder``'s, with the options ``model.resdecay_spec`` recorded; then the blocks it keeps at alpha 1)."""
    return [(name, block, adapter.name) for name, block, adapter in block_adapters(model)]


def block_adapters(model: nn.Module) -> list[tuple[str, nn.Module, BlockAdapter]]:
    """``residual_blocks`` with each block's adapter itself (what reads its factors and its adds)."""
    found = _supported_blocks(model, on_blocks=False)  # a read-only query: nothing is kept on the model
    order = depth_order_for(model)
    if order is not None and found:
        spec = getattr(model, "resdecay_spec", None) or {}
        scheduled, plain = order.order(model, found, _chosen(order.options, spec))
        found = scheduled + plain
    return _one_add_count(found)[0]


def _supported_blocks(model: nn.Module, refused: list | None = None, on_blocks: bool = True
                      ) -> list[tuple[str, nn.Module, BlockAdapter]]:
    """Every block an adapter takes (blocks inside one are its own business and are not listed): the registered
    adapters' first, then the traced adapter's (``adapters.traced``) for the candidates none of them takes, each
    kept so that ``adapter_for`` finds it (on its block when ``on_blocks``: decayify; beside it otherwise: a read-only
    query changes nothing on the model); ``refused`` gets the traced adapter's refusals ``(name, class, reason)``.
    The one block search: every entry carries its adapter, which no later step looks up again."""
    found: list[tuple[str, nn.Module, BlockAdapter]] = []
    for name, m in model.named_modules():
        if found and name.startswith(found[-1][0] + ".") and found[-1][0]:
            continue
        adapter = adapter_for(m)
        if adapter is not None:
            found.append((name, m, adapter))
    traced, left = trace_blocks(model, found, on_blocks)
    if refused is not None:
        refused += left
    depth = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return sorted(found + traced, key=lambda entry: depth[entry[0]])


class PartialDecayWarning(UserWarning):
    """``decayify`` left residual blocks of a kind it does not support at alpha 1."""


# class names that say "residual block" (timm's ResNetV2 Bottleneck, ParallelScalingBlock, ...)
_LOOKS_RESIDUAL = re.compile(r"(Block|Bottleneck|ResBlock|ResidualBlock)\d*$")


def unsupported_blocks(model: nn.Module, found: list[tuple[str, nn.Module, str]]) -> list[tuple[str, str]]:
    """(name, class) of the outermost modules named like residual blocks that are neither supported
    blocks, nor inside one, nor containers of one: the blocks ``decayify`` leaves at alpha 1.

    Args:
        model: the model ``decayify`` was given.
        found: its supported blocks, as ``residual_blocks`` lists them.
    """
    done = [name for name, _, _ in found]
    out: list[tuple[str, str]] = []
    for name, m in model.named_modules():
        if not _LOOKS_RESIDUAL.search(type(m).__name__):  # a block an adapter takes is in ``found`` or inside one
            continue
        related = any(name == d or name.startswith(d + ".") or d.startswith(name + ".") for d in done) or (
            name == "" and bool(done))  # the model itself, named like a block, holding supported blocks
        if not related and not any(name.startswith(o + ".") or o == "" for o, _ in out):
            out.append((name, f"{type(m).__module__}.{type(m).__name__}"))
    return out


def _say_what_was_left(model: nn.Module, found: list, skipped: list[tuple[str, str]], why: dict) -> None:
    """One warning naming what was decayed and what was not (e.g. a hybrid ViT's ResNet stem), and the blocks the
    traced adapter refused (``why``: name -> its one-line reason)."""
    kinds = sorted({cls for _, cls in skipped})
    refused = [name for name, _ in skipped if name in why]
    traced = (f"; the traced adapter refused {len(refused)}: {', '.join(refused[:5])}{' ...' if len(refused) > 5 else ''}"
              f" ({why[refused[0]]})") if refused else ""
    warnings.warn(f"decayify decayed {len(found)} block(s) of {type(model).__name__} ({found[0][0]} .. {found[-1][0]}) "
                  f"but left {len(skipped)} residual block(s) of a kind it does not support at alpha 1, first "
                  f"{skipped[0][0]} ({', '.join(kinds)}){traced}; the alpha schedule spans the decayed blocks only "
                  f"(alphas_of(model) lists them); {COVERAGE}", PartialDecayWarning, stacklevel=3)


def decayify(model: nn.Module, alpha_min: float, schedule: str = "linear", zero_init: bool = False,
             branches: str = "both", shortcut: str = "decay", **options: str) -> nn.Module:
    """Scale the identity shortcut of every residual block of ``model`` (in place) by the factors
    of the shortcut formula ``shortcut`` (by default the decay: ``alpha_schedule``, from 1 at the
    first residual add to ``alpha_min`` at the last).

    Transformer blocks have two adds (attention, MLP), ResNet blocks one. Calling it again
    replaces the settings. ``model.resdecay_spec`` records the structure (alpha_min, schedule,
    branches, shortcut), so ``decayify(model, **model.resdecay_spec)`` rebuilds it and never touches weights.

    Args:
        model: a model holding supported residual blocks (see ``SUPPORTED``).
        alpha_min: the factor of the last residual add, in (0, 1]; 1 leaves the model exactly as it was.
        schedule: "linear", "paper", "cosine" or "constant" (see ``resdecay.schedule``).
        zero_init: zero the last layer of every branch *now* (the paper's init for a model about to be
            trained). Off unless asked for, and not recorded in the spec: loaded weights stay as they are.
        branches: "both", "attn" or "mlp": which sub-block of transformer blocks is decayed (Table 3b).
        shortcut: a registered formula with fixed factors (``resdecay.nn.residual``: decay, scaled_sum,
            scaled_branch, or one registered by the caller); recorded in the spec unless "decay".
        **options: keywords the model's block adapters or depth order declare (``BlockAdapter.options``), e.g. an
            MM-DiT's ``context_stream`` or a U-Net's ``unet_depth``; each is recorded in the spec when given.

    Returns:
        ``model``, decayified in place. Blocks of unsupported kinds beside supported ones stay at alpha 1
        and a ``PartialDecayWarning`` names them.
    """
    refused: list = []
    found = _supported_blocks(model, refused)
    order = depth_order_for(model)
    skipped, why = _left_blocks(model, found, refused)
    if not found:
        raise TypeError(_refusal(model, skipped, why))
    chosen = _check_options(model, found, order, options)
    plain: list = []
    if order is not None:  # a U-Net: down, mid, up (diffusers registers up before mid)
        found, plain = order.order(model, found, chosen)
    found, left = _one_add_count(found)
    skipped += left
    factors = _plan(found, alpha_min, schedule, branches, shortcut)
    update = _update_of(shortcut, found)
    record = _library_recorder(model)  # a transformers / diffusers model: its config's record, checked first
    if skipped and (update is not None or any(v != 1.0 for a, b in factors for v in (*a, *b))):
        _say_what_was_left(model, found, skipped, why)
    planned = list(zip(found, factors, strict=True))
    planned += [(entry, ((1.0,) * entry[2].adds,) * 2) for entry in plain]
    for (_name, block, adapter), (a, b) in planned:
        _remove_hooks(block)
        unguard(block)  # a traced block's argument check, also when an adapter registered since takes it
        given = {k: v for k, v in chosen.items() if k in adapter.options}
        adapter.install(block, a, b, **given, **({} if update is None else {"update": update}))
        block.resdecay_alpha = a
        if zero_init:
            adapter.zero_init(block)
    # the structure only: zero_init is an action of this call, never something to re-apply
    model.resdecay_spec = {"alpha_min": float(alpha_min), "schedule": schedule, "branches": branches}
    if shortcut != "decay":  # specs written before formulas reached decayify have no key: decay
        model.resdecay_spec["shortcut"] = shortcut
    model.resdecay_spec.update(options)  # the keywords given (a default left out stays out: older readers agree)
    if record is not None:
        record({"op": "decayify", "on": type(model).__name__, **model.resdecay_spec})
    return model


def _left_blocks(model: nn.Module, found: list, refused: list) -> tuple[list[tuple[str, str]], dict]:
    """(name, class) of the residual blocks left at alpha 1, in module order (those named like blocks that no
    adapter takes, and the traced adapter's refusals), and name -> the traced adapter's reason."""
    skipped = unsupported_blocks(model, found)
    named = {name for name, _ in skipped}
    skipped += [(name, cls) for name, cls, _ in refused if name not in named]
    depth = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return sorted(skipped, key=lambda entry: depth[entry[0]]), {name: why for name, _, why in refused}


COVERAGE = "supported kinds: docs/coverage.md; add yours with register_adapter"


def _short(reason: str, most: int) -> str:
    """``reason`` in at most ``most`` characters: its middle (a quoted source line) elided at word boundaries, the
    start (what is wrong) given more room than the end."""
    if len(reason) <= most:
        return reason
    head, tail = reason[: int(0.6 * (most - 5))], reason[len(reason) - int(0.4 * (most - 5)):]
    head, tail = head.rpartition(" ")[0] or head, tail.partition(" ")[2] or tail
    return f"{head} ... {tail}"


def _refusal(model: nn.Module, skipped: list[tuple[str, str]], why: dict) -> str:
    """The one line (at most 300 characters) for a model with no supported block: the block class met (a stack's
    repeated layer counts as a block: CLIP's ``CLIPEncoderLayer``), why the traced adapter refused it, the
    nearest supported kind of its library, and where the supported kinds are listed."""
    own = [] if type(model).__module__.startswith("torch.") else [("", f"{type(model).__module__}.{type(model).__name__}")]
    met = skipped or _stack_members(model) or own  # a torch.nn layer given alone is no block of anyone's library
    head, tail, reason = f"decayify found no supported residual block in {type(model).__name__}", f"; {COVERAGE}", ""
    if met:
        library, cls = met[0][1].partition(".")[0], met[0][1].rpartition(".")[2]
        head += f": {cls}"
        tail = f"; nearest supported: {nearest_supported(cls, library, short=True)}{tail}"
        reason = why.get(met[0][0], "").removeprefix(f"{cls}: ")
    room = 300 - len(head) - len(tail) - len(" (traced adapter: )")
    return f"{head} (traced adapter: {_short(reason, max(room, 40))}){tail}" if reason else head + tail


def _stack_members(model: nn.Module) -> list[tuple[str, str]]:
    """(name, class) of the first module of the first stack (an ``nn.ModuleList`` / ``nn.Sequential`` holding two or
    more modules of one class): what a model's blocks are when no class is named like one."""
    for name, m in model.named_modules():
        if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2:
            kinds = [type(c) for c in m]
            if kinds.count(kinds[0]) >= 2 and not isinstance(m[0], (nn.ModuleList, nn.Sequential)):
                return [(f"{name}.0" if name else "0", f"{kinds[0].__module__}.{kinds[0].__name__}")]
    return []


def _chosen(declared: dict, given: dict) -> dict:
    """Each declared option's value: the one given, else its default (the first choice)."""
    return {k: given.get(k, choices[0]) for k, choices in declared.items()}


def _check_options(model: nn.Module, found: list, order, options: dict) -> dict:
    """The keywords beyond the schedule (``context_stream``, ``unet_depth``, ...), checked against those the
    model's adapters and depth order declare: an unknown one, or a value not among the choices, is one line."""
    declared: dict = {}
    for owner in [adapter for _, _, adapter in found] + ([order] if order is not None else []):
        declared.update(owner.options)
    unknown = sorted(set(options) - set(declared))
    if unknown:
        takes = ", ".join(f"{k} ({'/'.join(v)})" for k, v in declared.items()) or "none"
        raise TypeError(f"decayify got unknown keyword(s) {', '.join(unknown)} for {type(model).__name__}; "
                        f"its blocks take: {takes}")
    for k, v in options.items():
        check_choice(v, declared[k], k)
    return _chosen(declared, options)


def _plan(found: list, alpha_min: float, schedule: str, branches: str, shortcut: str) -> list[tuple[tuple, tuple]]:
    """(alphas, betas) per block. Blocks of one add count follow ``shortcut_plan`` (a transformer's attn / MLP
    pairs); blocks of mixed counts (a U-Net's one-add ResNet blocks and two-add transformer blocks, whose
    adapters allow it) share one schedule over all their adds in depth order (paper eq. 3: alpha by the add's depth)."""
    counts = [adapter.adds for _, _, adapter in found]
    keys = ("shortcut", "branches")
    if len(set(counts)) == 1 and counts[0] in (1, 2):
        check_shortcut(shortcut, branches, counts[0], fixed_by="decayify (its hooks)", keys=keys)
        plan = shortcut_plan(len(found), alpha_min, schedule, branches, shortcut, counts[0])
        return [(tuple(a), tuple(b)) for a, b in zip(plan.alphas.tolist(), plan.betas.tolist(), strict=True)]
    if branches != "both":
        raise TypeError(f"decayify branches={branches} picks a transformer sub-block, but this model's blocks have "
                        f"{'/'.join(map(str, sorted(set(counts))))} adds each on one schedule; use branches=both")
    check_shortcut(shortcut, "both", 1, fixed_by="decayify (its hooks)", keys=keys)
    plan = shortcut_plan(sum(counts), alpha_min, schedule, "both", shortcut, 1)
    alphas, betas = plan.alphas[:, 0].tolist(), plan.betas[:, 0].tolist()
    out, i = [], 0
    for n in counts:
        out.append((tuple(alphas[i:i + n]), tuple(betas[i:i + n])))
        i += n
    return out


def _update_of(shortcut: str, found: list) -> str | None:
    """The residual update the formula names (``nn.updates``), checked against the blocks' mechanisms: the correction
    hooks, the fused add and resdecay's blocks carry one; a replaced forward or a scaled shortcut adds the branch as
    it is, so a formula with an update is refused for those blocks (one line naming them)."""
    formula = SHORTCUT_FORMULAS.get(shortcut)
    if formula is None or formula.update is None:
        return None
    cannot = sorted({adapter.name for _, _, adapter in found if adapter.updates is None})
    if cannot:
        raise TypeError(f"decayify cannot apply shortcut={shortcut} (the {formula.update} update of the branch) to "
                        f"{', '.join(cannot)} blocks: their adds are reached by a replaced forward or a scaled shortcut, "
                        "which add the branch as it is; use a formula without an update (decay, scaled_sum, ...)")
    return formula.update


def _library_recorder(model: nn.Module):
    """For a transformers / diffusers model: ``resdecay.nn.config_record.recorder`` (the decay goes into
    ``model.config.resdecay``, which the library's save_pretrained keeps); None for any other model."""
    if not any(c.__module__.startswith(("transformers.", "diffusers.")) for c in type(model).__mro__):
        return None
    return recorder(model, "decayify")


def _one_add_count(found: list) -> tuple[list, list[tuple[str, str]]]:
    """One schedule needs one number of adds per block. A model holding both transformer blocks (two
    adds) and convolutional ones (one: a hybrid ViT's ResNet stem) has its transformer blocks decayed
    and the others left at alpha 1, named in the PartialDecayWarning."""
    counts = {adapter.adds for _, _, adapter in found}
    if len(counts) <= 1 or all(adapter.mixed_adds for _, _, adapter in found):
        return found, []
    keep = max(counts)
    left = [(n, f"{type(m).__module__}.{type(m).__name__}") for n, m, adapter in found if adapter.adds != keep]
    return [f for f in found if f[2].adds == keep], left


def block_factors(block: nn.Module) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(alphas, betas) a residual block uses now, read where its add reads them (the hooked modules
    of a library block, so a hand-changed ``resdecay_alpha`` shows, or a resdecay block's own
    attributes). Transformer blocks give ``(attn, mlp)`` pairs, ResNet blocks one factor each."""
    adapter = adapter_for(block)
    if adapter is None:
        return factors_of(block)  # AdaLNBlock and other blocks built on residual_add
    return adapter.factors(block)


def alphas_of(model: nn.Module) -> list[tuple[str, tuple[float, ...]]]:
    """The shortcut factors in use, per residual block: ``[(name, (alpha_attn, alpha_mlp)), ...]``
    for transformer blocks, ``[(name, (alpha,)), ...]`` for ResNet blocks. Learnable factors are
    read as their current values."""
    return [(name, adapter.factors(block)[0]) for name, block, adapter in block_adapters(model)]
