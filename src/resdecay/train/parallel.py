"""Past DDP: FSDP2 (``torch.distributed.fsdp.fully_shard``) and HSDP for resdecay's families and for
``decayify``d models of other libraries, in the order the field applies them (facebookresearch/dinov3's
``ac_compile_parallelize.py``, torchtitan): activation checkpointing (the model's own
``grad_checkpointing``: it wraps each block's call) -> ``torch.compile`` per block -> ``fully_shard`` per
block, then the root.

``train.parallel``:
    ddp    every rank holds the whole model, optimizer state and EMA; gradients are all-reduced (default)
    fsdp2  parameters, gradients, optimizer state and EMA are sharded over all ranks (one mesh dimension)
    hsdp   sharded within a node, replicated across nodes (a 2-D mesh: replicate x shard), so the
           all-gathers stay on the node's fast links and only the gradient all-reduce crosses nodes

Nothing about the decay changes: the α table is a buffer (replicated, never sharded: every rank needs it
whole); a learnable α is a 0-d parameter, which FSDP2 cannot split, so it is kept whole on every rank with its
gradient averaged like DDP's (``replicate_scalars``).
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..models import build_model
from ..models.contract import ResidualModel
from ..nn.decayify import residual_blocks
from ..nn.hyper import has_streams

SHARDED = ("fsdp2", "hsdp")


def node_count(world_size: int, nodes: int | None = None) -> int:
    """The nodes an HSDP mesh replicates across: ``train.hsdp_nodes``, else the launcher's (torchrun sets
    LOCAL_WORLD_SIZE: the processes on each node). One line when it does not divide the world size."""
    if nodes is None:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or world_size)
        nodes = max(world_size // max(per_node, 1), 1)
    if nodes < 1 or world_size % nodes:
        raise ConfigError(f"train.parallel=hsdp with {nodes} node(s) does not divide the {world_size} processes into "
                          "equal nodes; set train.hsdp_nodes to a divisor of the world size (or launch equal nodes)")
    return nodes


def one_process_group(env, parallel: str, say) -> None:
    """``fsdp2`` / ``hsdp`` on one process: a one-rank group (a no-op mesh), said once, so the run writes the
    same DCP checkpoints a sharded run resumes on more processes."""
    import torch.distributed as dist

    if env.distributed or dist.is_initialized():
        return
    say(f"note: train.parallel={parallel} on one process: nothing to shard (a one-rank mesh); checkpoints are DCP folders")
    dist.init_process_group("gloo" if env.device.type == "cpu" else "nccl", store=dist.HashStore(), rank=0, world_size=1)
    env.owns_group = True


def broadcast_from_rank0(model: nn.Module) -> None:
    """Rank 0's weights and buffers on every rank, as DDP's constructor does: each rank built its own random
    init (its own seed), and ``fully_shard`` keeps each rank's slice of its own, so without this the
    sharded model would be a patchwork of inits."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        with torch.no_grad():
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)


def check_layout(parallel: str, world_size: int, nodes: int | None) -> None:
    """Before anything is written: an HSDP node count that does not divide the processes is one line."""
    if parallel == "hsdp":
        node_count(world_size, nodes)


def describe(parallel: str, world_size: int, nodes: int | None, reshard_after_forward: bool, noise_scope: str) -> str:
    """The run header's line on how the ranks share the model and draw their noise."""
    if parallel == "ddp":
        share = f"ddp: every rank holds the whole model ({world_size} replica{'s' * (world_size > 1)})"
    else:
        if parallel == "hsdp":
            n = node_count(world_size, nodes)
            mesh = f"replicate {n} node(s) x shard {world_size // n} per node"
        else:
            mesh = f"shard {world_size}"
        share = (f"{parallel}: weights, gradients, optimizer state and EMA sharded (mesh {mesh}); "
                 f"{'re' if reshard_after_forward else 'not re'}sharded after each block's forward")
    noise = "drawn for the effective batch" if noise_scope == "global" else "drawn per rank"
    return f"parallel {share} | masks and noise {noise} (train.noise_scope={noise_scope})"


def device_mesh(parallel: str, world_size: int, device: torch.device, nodes: int | None = None):
    """The mesh ``fully_shard`` shards over: 1-D over every rank (fsdp2), or (replicate=nodes, shard=per node)."""
    from torch.distributed.device_mesh import init_device_mesh

    if parallel == "hsdp":
        n = node_count(world_size, nodes)
        return init_device_mesh(device.type, (n, world_size // n), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))


def mixed_precision(device: torch.device, param_dtype: torch.dtype | None):
    """bf16 parameters in the forward with fp32 gradient reduction on GPU (dinov3's policy); fp32 on CPU."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if device.type != "cuda" or param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules sharded one by one (each all-gathers its parameters just before its forward): a
    resdecay family's ``blocks`` and ``decoder_blocks`` (the model contract), else every residual block
    ``decayify`` finds in another library's model; the root takes what is left (embeddings, norms, heads).
    None with hyper-connections: their steps call each block's branches, not its ``forward``, so the whole model is
    one unit (gathered at once in the forward; its state is still sharded)."""
    if has_streams(model):
        return []
    if isinstance(model, ResidualModel):
        return [*model.blocks, *model.decoder_blocks]

    return [block for _, block, _ in residual_blocks(model)]


def parallelize(model: nn.Module, mesh, *, compile: bool = False, reshard_after_forward: bool = True,
                param_dtype: torch.dtype | None = None) -> nn.Module:
    """Shard ``model`` in place over ``mesh`` (FSDP2 on a 1-D mesh, HSDP on a 2-D one) and return it.

    The same function a Lightning ``ModelParallelStrategy``'s ``configure_model`` can call with its
    ``device_mesh``. Activation checkpointing is the model's own setting (applied inside its forward),
    so the order is AC -> compile (each block, ``compile=True``) -> ``fully_shard`` (each block, then
    the root). Rank 0's weights are broadcast first (as DDP does), so every rank may build its own init.

    Args:
        reshard_after_forward: free each block's gathered parameters after its forward (less memory,
            one more all-gather in the backward); False keeps them until the backward (ZeRO-2-like).
        param_dtype: the forward's parameter dtype on GPU (bf16); gradients are reduced in fp32.
    """
    from torch.distributed.fsdp import fully_shard

    broadcast_from_rank0(model)
    device = torch.device(mesh.device_type)
    policy = mixed_precision(device, param_dtype)
    scalars = replicate_scalars(model)
    for block in shard_units(model):
        if compile:
            block.compile()
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy,
                    ignored_params=scalars)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy, ignored_params=scalars)
    return model


def replicate_scalars(model: nn.Module) -> set[nn.Parameter]:
    """The 0-d parameters (a learnable α, ReZero's and SkipInit's gains), which ``fully_shard`` cannot split: kept
    whole on every rank, their gradients averaged over the ranks as each backward accumulates them (averaging the
    running sum is exact under accumulation too: the part already averaged is the same on every rank)."""
    import torch.distributed as dist

    scalars = {p for p in model.parameters() if p.ndim == 0}
    if dist.is_initialized() and dist.get_world_size() > 1:
        for p in scalars:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(_average_gradient)
    return scalars


def _average_gradient(param: nn.Parameter) -> None:
    import torch.distributed as dist

    dist.all_reduce(param.grad)  # a sum (gloo has no average), then / world size
    param.grad.div_(dist.get_world_size())


def gradient_sync(model: nn.Module, sync: bool, distributed: bool):
    """The context a micro-batch's backward runs in: during accumulation only the last micro-batch
    reduces gradients (DDP's ``no_sync``; FSDP2's ``set_requires_gradient_sync``)."""
    if sync or not distributed:
        return contextlib.nullcontext()
    if is_sharded(model):
        return _fsdp_no_sync(model)
    return model.no_sync()


@contextlib.contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def full_state_dict(model: nn.Module) -> dict:
    """The whole (unsharded) state_dict of a sharded model on every rank (a collective: every rank calls it);
    a plain model's own state_dict."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_sharded(model):
        return model.state_dict()
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def gathered_copy(model: nn.Module, model_cfg, device: torch.device) -> nn.Module:
    """A whole, unsharded copy of a sharded resdecay model on every rank (a collective), in eval mode: what the
    epoch-end hooks (online evaluation, figures) read."""

    copy = build_model(model_cfg)
    copy.load_state_dict(full_state_dict(model))
    return copy.to(device).eval()
