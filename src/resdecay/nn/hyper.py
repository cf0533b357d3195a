"""Hyper-connections around resdecay's blocks: n residual streams instead of one, through the
``hyper-connections`` package (lucidrains), not re-written here.

Hyper-connections (Zhu et al., arXiv 2409.19606) widen the residual stream into n copies ``H`` (n x D per
token). Before each sub-block a learned, input-dependent width connection mixes the streams into the
branch's input and the streams among themselves (``H_res``, n x n); after it the depth connection spreads
the branch's output back over the streams (``H_post``, a weight per stream). mHC (Xie et al., arXiv
2512.24880) constrains ``H_res`` to a doubly-stochastic matrix (Sinkhorn-Knopp) and ``H_pre`` / ``H_post``
to positive weights, so the mixing can neither amplify nor cancel the streams.

The decay on the stream
-----------------------
With n streams the shortcut *is* the streams' carried part, ``H_res H``, so the decayed add of paper eq. 3,
``x_{l+1} = alpha_l x_l + beta_l f_l(x_l)``, becomes, for every sub-block l (attention, then MLP)::

    h_l     = H_pre,l^T H_l                                   (the branch's input, one D-vector per token)
    H_{l+1} = alpha_l * (H_res,l H_l) + beta_l * H_post,l f_l(h_l)

alpha_l and beta_l are the block's own factors (``model.shortcut`` on ``model.decay_branches``; a learnable
formula's trained alpha included). They enter through the package's ``depth_residual_fn``, the hook it
gives for changing how the spread branch output joins the carried streams (its default is the plain sum,
alpha = beta = 1), so the package's width and depth connections run as they are. With mHC, whose
``H_res`` keeps the streams' sum, the decay is then the only thing that shrinks the identity path, as in
the single-stream model. A residual update (``nn.updates``: the orthogonal one) is defined against one
stream ``x`` and is refused with hyper-connections.

Streams enter as the package's ``expand_stream`` (n copies of the embedded tokens) and are read through its
``reduce_stream`` (their sum): what every feature read, skip source and final norm sees is that (B, T, D)
sum. ``model.hyper_streams=1`` builds no hyper-connection at all: the model, its state_dict keys and its
outputs are exactly the single-stream ones.
"""

from __future__ import annotations

from typing import Callable, Literal, get_args

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from ..errors import ConfigError, UserError
from .residual import SHORTCUT_FORMULAS, side_add

HyperVariant = Literal["hc", "mhc"]
ADDS = ("attn", "mlp")  # the two residual adds of a transformer block, in order


def check_hyper(streams, variant: str, shortcut: str, drop_identity: float = 0.0) -> None:
    """One line for hyper-connection settings that cannot build: ``model.hyper_streams`` not an integer >= 1,
    ``model.hyper_variant`` unknown, a shortcut formula with a residual update or a dropped identity (both
    defined against one stream), the package missing."""
    if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
        raise ConfigError(f"model.hyper_streams must be an integer >= 1 (1 = one residual stream, no "
                          f"hyper-connections), got {streams!r}")
    if variant not in get_args(HyperVariant):
        raise ConfigError(f"model.hyper_variant {variant!r} is unknown; choose one of {', '.join(get_args(HyperVariant))}")
    if streams == 1:
        return
    formula = SHORTCUT_FORMULAS.get(shortcut)
    if formula is not None and formula.update is not None:
        raise ConfigError(f"model.shortcut={shortcut} applies the {formula.update!r} update, defined against one residual "
                          "stream; with model.hyper_streams > 1 use a formula without an update (decay, learnable, ...)")
    if drop_identity:
        raise ConfigError(f"model.drop_identity={drop_identity} drops one stream's shortcut; with model.hyper_streams > 1 "
                          "the shortcut is the streams' mixing: set model.drop_identity=0 (model.drop_branch works)")
    package()


def package():
    """The ``hyper_connections`` module, or one ConfigError telling how to install it."""
    try:
        import hyper_connections
    except ImportError:
        raise ConfigError("model.hyper_streams > 1 needs the hyper-connections package: pip install hyper-connections "
                          "(or pip install 'resdecay[hyper]'), or set model.hyper_streams=1") from None
    return hyper_connections


class StreamDecay:
    """The package's ``depth_residual_fn`` for one add of ``block``: ``alpha * carried + beta * spread``.

    Reads the block's factors at call time, so a learnable alpha is trained through it. A plain object, not
    a module: the factors stay the block's (and its state_dict's) alone."""

    def __init__(self, block: nn.Module, add: str):
        self.block, self.add = block, add

    def __call__(self, spread: torch.Tensor, carried: torch.Tensor) -> torch.Tensor:
        alpha, beta = getattr(self.block, f"alpha_{self.add}"), getattr(self.block, f"beta_{self.add}")
        return side_add(carried, spread, alpha, beta)  # alpha = beta = 1: carried + spread, the package's own add


def branches_of(block: nn.Module, cond: tuple) -> tuple[Callable, Callable]:
    """The two branch functions of a ``Block`` or ``AdaLNBlock`` (input (B, T, D) -> the branch output the
    block's ``residual_add`` receives): the block's own ``branches``, so gains and drops are the same."""
    return block.branches(*cond)


class HyperStep(nn.Module):
    """One block's two hyper-connections (``attn``, ``mlp``: the package's modules); ``forward(x, block, *cond)``
    runs the block on the streams. A module of its own so that forward hooks (the stability monitor's block RMS)
    see each block's output streams; the block is an argument, not a child, so its weights stay the model's."""

    def __init__(self, init: Callable, block: nn.Module, index: int):
        super().__init__()
        # layer_index fixes which stream feeds each branch at init (the package draws it at random otherwise)
        self.attn, self.mlp = (init(layer_index=2 * index + k, depth_residual_fn=StreamDecay(block, add))
                               for k, add in enumerate(ADDS))

    def forward(self, x: torch.Tensor, block: nn.Module, *cond: torch.Tensor) -> torch.Tensor:
        if block.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(self._adds, x, block, *cond, use_reentrant=False)
        return self._adds(x, block, *cond)

    def _adds(self, x: torch.Tensor, block: nn.Module, *cond: torch.Tensor) -> torch.Tensor:
        for connection, branch in zip((self.attn, self.mlp), branches_of(block, cond), strict=True):
            branch_input, add_residual = connection(x)
            x = add_residual(branch(branch_input))
        return x


class HyperStreams(nn.Module):
    """n residual streams around a stack of resdecay blocks: one ``HyperStep`` per block (``steps[i].attn`` the
    package hyper-connection of block i's attention add, ``.mlp`` its MLP add), the package's expand and reduce.

    Args:
        blocks: the model's ``Block`` / ``AdaLNBlock`` list (held by the model; read here, not owned).
        dim: token width D.
        streams: n >= 2.
        variant: ``hc`` (Zhu et al.) or ``mhc`` (Sinkhorn-constrained).
        tokens: tokens a block sees per sample (for the FLOPs estimate).
        per_stream_flops: FLOPs per sample of the layers between blocks that run once per stream (U-ViT's skip
            Linears); the estimate counts the n - 1 extra runs.
    """

    def __init__(self, blocks: nn.ModuleList, dim: int, streams: int, variant: HyperVariant, tokens: int,
                 per_stream_flops: float = 0.0):
        super().__init__()
        hc = package()
        make = (hc.get_init_and_expand_reduce_stream_functions if variant == "hc"
                else hc.mc_get_init_and_expand_reduce_stream_functions)
        init, self.expand, self.reduce = make(streams, dim=dim, disable=False)
        self.streams, self.variant, self.dim, self.tokens = streams, variant, dim, tokens
        self.per_stream_flops = float(per_stream_flops)
        self.steps = nn.ModuleList(HyperStep(init, blk, i) for i, blk in enumerate(blocks))

    def block(self, i: int, blk: nn.Module, x: torch.Tensor, *cond: torch.Tensor) -> torch.Tensor:
        """Block i on the streams x ((B n), T, D) -> ((B n), T, D); the block's grad_checkpointing is honoured."""
        return self.steps[i](x, blk, *cond)

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_sample(self, tokens: int | None = None) -> float:
        """Extra forward FLOPs per sample on ``tokens`` tokens (default: ``self.tokens``) (2 per multiply-add, matmuls only, as ``block_flops``): per token and
        residual add, the width connection's dynamic weights (2nD(n+1)) and stream mixing (2nD(n+1)), the depth
        connection's dynamic weight (2nD) and spreading the branch over the streams (2nD): 4nD(n+2); plus the
        n - 1 extra runs of per-stream layers. The norms, Sinkhorn's n x n iterations and the adds are left out."""
        n, d = self.streams, self.dim
        per_add = 4 * n * d * (n + 2) * (self.tokens if tokens is None else tokens)
        return float(2 * len(self.steps) * per_add + (n - 1) * self.per_stream_flops)

    def extra_repr(self) -> str:
        return f"streams={self.streams}, variant={self.variant}"


def hyper_streams(cfg, blocks: nn.ModuleList, tokens: int, per_stream_flops: float = 0.0) -> HyperStreams | None:
    """The model's ``HyperStreams`` for ``cfg.hyper_streams`` > 1, else None (the single-stream model)."""
    streams = getattr(cfg, "hyper_streams", 1)
    if streams == 1:
        return None
    return HyperStreams(blocks, cfg.embed_dim, streams, getattr(cfg, "hyper_variant", "hc"), tokens, per_stream_flops)


# ----------------------------------------------------------------------------- what the models' loops call
def expand_streams(hyper: HyperStreams | None, x: torch.Tensor) -> torch.Tensor:
    """(B, T, D) -> the streams ((B n), T, D); unchanged without hyper-connections."""
    return x if hyper is None else hyper.expand(x)


def reduce_streams(hyper: HyperStreams | None, x: torch.Tensor) -> torch.Tensor:
    """The streams ((B n), T, D) -> their sum (B, T, D): what a feature read or a skip source sees."""
    return x if hyper is None else hyper.reduce(x)


def run_block(hyper: HyperStreams | None, i: int, blk: nn.Module, x: torch.Tensor, *cond: torch.Tensor) -> torch.Tensor:
    """Block i on x: the block itself, or through its hyper-connections."""
    return blk(x, *cond) if hyper is None else hyper.block(i, blk, x, *cond)


def streams_of(model_cfg) -> int:
    """The residual streams a model config builds (``model.hyper_streams``; 1 for a family without the setting)."""
    return getattr(model_cfg, "hyper_streams", 1)


def block_steps(model: nn.Module) -> list[nn.Module]:
    """The modules whose outputs are a model's block outputs: its ``blocks``, or with hyper-connections each block's
    ``HyperStep`` (whose output is the block's n streams)."""
    hyper = getattr(model, "hyper", None)
    return list(hyper.steps) if isinstance(hyper, HyperStreams) else list(model.blocks)


def has_streams(model: nn.Module) -> bool:
    """Whether ``model`` runs hyper-connections: its blocks' branches are then called by the streams' steps, never
    through the blocks' own ``forward`` (what FSDP2's per-block gathering hooks)."""
    return isinstance(getattr(model, "hyper", None), HyperStreams)


def refuse_streams(model: nn.Module, what: str) -> None:
    """One UserError when ``model`` runs hyper-connections: ``what`` reads a block's adds on one residual stream
    (the diagnostics' taps, the norm profile), which n mixed streams do not have."""
    hyper = getattr(model, "hyper", None)
    if isinstance(hyper, HyperStreams):
        raise UserError(f"{what} reads the adds of one residual stream, but this model mixes {hyper.streams} "
                        f"(model.hyper_streams={hyper.streams}, hyper-connections): measure it with knn, probe or rank")


def hyper_summary(model: nn.Module) -> dict | None:
    """What a run's summary says of its hyper-connections (None without them): streams, variant, extra
    parameters and extra forward FLOPs per sample (``HyperStreams.flops_per_sample``), each also as a
    fraction of the whole model's."""
    hyper = getattr(model, "hyper", None)
    if not isinstance(hyper, HyperStreams):
        return None
    params, total = hyper.parameter_count(), sum(p.numel() for p in model.parameters())
    flops = hyper.flops_per_sample()
    model_flops = model.flops_per_sample() if hasattr(model, "flops_per_sample") else None
    return {"streams": hyper.streams, "variant": hyper.variant, "params": params, "params_fraction": params / total,
            "flops_per_sample": flops, "flops_fraction": flops / model_flops if model_flops else None}
