"""One code path for CPU, one GPU and many GPUs: the environment decides.

Under ``torchrun`` (RANK / WORLD_SIZE / LOCAL_RANK set) a process group is started (NCCL on
GPUs, Gloo on CPU) and each process takes GPU ``LOCAL_RANK``; otherwise it is a single
process on ``cuda`` if available (or asked for) and on the CPU otherwise. Multi-node works the
same way, torchrun sets the variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import ConfigError, check_choice


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    owns_group: bool = False  # this setup() started the process group, so its cleanup() ends it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(device: str = "auto", option: str = "train.device") -> torch.device:
    """auto -> cuda when a GPU is visible, else cpu; an explicit cuda without a GPU is one clear error."""
    check_choice(device, ("auto", "cpu", "cuda"), option)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"{option}=cuda but no CUDA GPU is visible; use cpu or auto")
    return torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")


def setup(device: str = "auto") -> DistEnv:
    """Start (or join) the process group torchrun describes and pick this process's device."""
    want_cuda = resolve_device(device).type == "cuda"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
        if want_cuda:
            torch.cuda.set_device(local)
        owns = not dist.is_initialized()  # a caller (ablate's grid) may keep one group across several runs
        if owns:
            dist.init_process_group(backend="nccl" if want_cuda else "gloo")
        dev = torch.device("cuda", local) if want_cuda else torch.device("cpu")
        return DistEnv(rank, world, local, dev, owns)
    return DistEnv(device=torch.device("cuda") if want_cuda else torch.device("cpu"))


def cleanup(env: DistEnv) -> None:
    """End the process group if this env's setup() started it (a group a caller keeps is left running)."""
    if env.owns_group and dist.is_initialized():  # (a one-process group too: train/parallel.py)
        dist.destroy_process_group()


def gather_objects(env: DistEnv, obj) -> list:
    """Every rank's ``obj`` on every rank (a one-element list when not distributed)."""
    if not env.distributed:
        return [obj]
    out = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def is_main_process() -> bool:
    """Rank 0 of a torchrun job (or a single process): the one that writes reports."""
    return int(os.environ.get("RANK", "0")) == 0
