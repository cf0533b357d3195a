"""Will the model fit? The network is built once, for real; while it is built, its parameters are
counted, and once they pass ``PROBE`` the whole model's parameters are counted on the meta device
(no allocation) and checked against the memory free, so ``model.depth=100000`` is one line within
seconds and 16 MiB of allocation, instead of minutes of allocation that end in the out-of-memory
killer. A smaller model is never counted: its weights, gradients and optimizer state take under
100 MiB.

The estimate is a lower bound: the weights, their gradients, the optimizer's state and the EMA
copy, 4 bytes per number each (fp32 master weights, as the loop keeps them). Activations come on
top and depend on the batch, so a model this refuses can never train here, while one it accepts
may still need a smaller ``train.batch_size``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook

from ...errors import ConfigError
from ...io import format_bytes
from ...models import build_model
from ...models.common import count_parameters

# fp32 numbers kept per parameter besides the weight and its gradient
OPTIMIZER_STATE = {"adamw": 2, "lars": 1, "sgd": 1}  # AdamW: two moments; LARS and SGD: momentum
SIZE_KEYS = ("depth", "decoder_depth", "embed_dim", "decoder_embed_dim", "width", "layers", "img_size")
PROBE = 1 << 22  # parameters built before the whole model is counted: 16 MiB of fp32 weights


def training_bytes(params: int, optimizer: str, ema: bool) -> int:
    """Bytes of weights, gradients, optimizer state and EMA copy for ``params`` fp32 parameters."""
    return 4 * params * (2 + OPTIMIZER_STATE.get(optimizer, 2) + int(ema))


def available_memory(device: torch.device) -> tuple[int | None, str]:
    """(bytes free for this process, what they are), or (None, ...) when it cannot be read. On the
    CPU, the processes torchrun starts on this machine share the RAM: each gets its part."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0], f"free memory on GPU {device}"
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        free = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None, "memory"
    procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return free // procs, "available RAM" + (f" per process ({procs} on this machine)" if procs > 1 else "")


def check_fits(cfg, device: torch.device) -> int | None:
    """Refuse, in one line, a model whose weights and optimizer state alone exceed the memory free
    on ``device``; returns the estimated parameter count (None when it could not be estimated).

    Args:
        cfg: the RunConfig about to be trained.
        device: the training device.
    """
    params = count_parameters(cfg.model, build_model)
    if params is None:
        return None
    need = training_bytes(params, cfg.train.optimizer, cfg.train.ema_decay > 0)
    if cfg.train.parallel != "ddp":  # each rank builds the whole model (and EMA) once, then keeps 1/N of the state
        need = max(4 * params * (1 + int(cfg.train.ema_decay > 0)), need // int(os.environ.get("WORLD_SIZE", "1")))
    free, what = available_memory(device)
    if free is not None and need > free:
        settings = vars(cfg.model)  # the family's config fields: the size settings it has are named
        sizes = ", ".join(f"model.{k}={settings[k]}" for k in SIZE_KEYS if k in settings)
        sizes = f" ({sizes})" if sizes else ""
        raise ConfigError(f"the model would have {params / 1e6:,.0f} M parameters{sizes}: its weights, gradients and "
                          f"{cfg.train.optimizer} state alone need about {format_bytes(need)}, more than the "
                          f"{format_bytes(free)} of {what}; lower model.depth or the widths")
    return params


@contextmanager
def refuse_if_too_big(cfg, device: torch.device):
    """``with refuse_if_too_big(cfg, device): build_model(cfg.model)`` builds the network once: when
    its parameters built so far pass ``PROBE``, ``check_fits`` counts the whole model on the meta
    device (on a forked RNG: the real build's random draws stay where they were) and refuses it, in
    one line, if it cannot fit.

    Args:
        cfg: the RunConfig about to be trained.
        device: the training device.
    """
    built, checked = 0, False

    def count(module, name, param):
        nonlocal built, checked
        if checked or param is None:
            return None
        built += param.numel()
        if built >= PROBE:
            checked = True  # before the meta count, whose parameters pass through this hook too
            with torch.random.fork_rng(devices=[]):
                check_fits(cfg, device)
        return None

    handle = register_module_parameter_registration_hook(count)
    try:
        yield
    finally:
        handle.remove()
