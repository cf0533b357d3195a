"""How to run a model on a batch of images so that its residual stream's blocks run once, unmasked:
resdecay's families through the model contract's ``forward_features``, timm models through theirs,
transformers models through their base model (an MAE with its random masking turned off and the
patch order kept), diffusers' DiT with a timestep and a class, anything else as ``model(x)`` or a
function the caller gives. Only the blocks' hooks read anything: what the call returns is dropped.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

from ..nn.adapters import hooks as adapter_hooks
from .sites import Site

Forward = Callable[[nn.Module, torch.Tensor], Any]


def _module_of(model: nn.Module) -> str:
    return type(model).__module__


def batched(value, batch: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
    """A fixed conditioning value (a number or a one-element tensor) repeated for ``batch`` images;
    integers stay integers (class labels), floats take the model's dtype (timesteps)."""
    if value is None:
        return None
    t = torch.as_tensor(value, device=device)
    if t.numel() != 1:
        raise ValueError(f"diagnostics take one fixed conditioning value per entry (e.g. t=0.5, y=3), got shape "
                         f"{tuple(t.shape)}")
    t = t.reshape(())
    return t.expand(batch).clone() if not t.is_floating_point() else t.to(dtype).expand(batch).clone()


@contextlib.contextmanager
def _unmasked(encoder: nn.Module) -> Iterator[Callable[[torch.Tensor], dict]]:
    """transformers' ViTMAE draws a random mask in every forward: ``mask_ratio`` 0 for the duration and
    ascending noise keep every patch in image order (the stream a probe of an MAE encoder reads)."""
    masker = next((m for m in encoder.modules() if hasattr(m, "random_masking")), None)
    if masker is None:
        yield lambda x: {}
        return
    config, old = masker.config, masker.config.mask_ratio
    config.mask_ratio = 0.0

    def noise(x: torch.Tensor) -> dict:
        p = config.patch_size
        n = (x.shape[-2] // p) * (x.shape[-1] // p)
        return {"noise": torch.arange(n, device=x.device, dtype=torch.float32).expand(x.shape[0], n)}
    try:
        yield noise
    finally:
        config.mask_ratio = old


def _base_model(model: nn.Module) -> nn.Module:
    """A transformers model's base model (the ViTMAE inside ViTMAEForPreTraining) when its forward takes
    ``pixel_values``; the model itself where ``base_model`` names a part that does not (DINOv3's encoder stack)."""
    base = getattr(model, "base_model", model)
    return base if "pixel_values" in inspect.signature(base.forward).parameters else model


@contextlib.contextmanager
def model_runner(model: nn.Module, conditioning: tuple = (), forward: Forward | None = None, sites: tuple = ()
                 ) -> Iterator[Callable[[torch.Tensor], None]]:
    """A function that runs ``model`` on a batch of images (B, C, H, W), for the duration.

    Args:
        model: the network (resdecay, timm, transformers, diffusers, or any taking ``model(x)``).
        conditioning: fixed values given to every image, in the order the model takes them after x
            (SiT / U-ViT: ``(t, y)``; diffusers: timestep, class label); ``y=None`` is the null label.
        forward: ``forward(model, x)`` to call instead (a model none of the above covers).
        sites: the blocks whose adds will be read (``reading``: their adapters' forwards installed where needed).
    """
    with _runner(model, conditioning, forward) as run, reading(sites):
        yield run


@contextlib.contextmanager
def _runner(model: nn.Module, conditioning: tuple, forward: Forward | None) -> Iterator[Callable[[torch.Tensor], None]]:
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)

    def cond(x: torch.Tensor) -> list:
        return [batched(c, x.shape[0], x.device, dtype) for c in conditioning]

    if forward is not None:
        yield lambda x: forward(model, x)
    elif hasattr(model, "forward_intermediates") and hasattr(model, "cfg"):  # resdecay's model contract
        yield lambda x: model.forward_features(x, *cond(x))
    elif _module_of(model).startswith("transformers."):
        base = _base_model(model)
        with _unmasked(base) as extra:
            yield lambda x: base(pixel_values=x, **extra(x))
    elif _module_of(model).startswith("diffusers."):
        names = ("timestep", "class_labels")
        yield lambda x: model(x, **dict(zip(names, cond(x), strict=False)))
    elif hasattr(model, "forward_features"):  # timm
        yield lambda x: model.forward_features(x, *cond(x))
    else:
        yield lambda x: model(x, *cond(x))


def image_batches(images, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """(images, labels or None) in order, from a (N, C, H, W) tensor / array or a Dataset of
    ``(image, label)`` pairs (or of images)."""
    if isinstance(images, Dataset) and not isinstance(images, torch.Tensor):
        for batch in DataLoader(images, batch_size=batch_size, shuffle=False):
            if isinstance(batch, (list, tuple)):
                yield batch[0], torch.as_tensor(batch[1])
            else:
                yield batch, None
        return
    images = torch.as_tensor(images)
    for start in range(0, len(images), batch_size):
        yield images[start:start + batch_size], None


def count(images) -> int:
    return len(images)


@contextlib.contextmanager
def reading(sites: list[Site]) -> Iterator[None]:
    """The adapters' replaced forwards on the blocks ``decayify`` left at alpha 1 (it installs none there), at the
    blocks' own factors, for the duration: their adds are ``residual_add`` calls, where the tap reads them."""
    installed = [s for s in sites if s.forward is not None]
    try:
        for s in installed:
            adapter_hooks.replace_forward(s.block, s.forward, [sub.alpha for sub in s.subs],
                                          [sub.beta for sub in s.subs])
        yield
    finally:
        for s in installed:
            s.block.__dict__.pop("forward", None)
            s.block.__dict__.pop("resdecay_factors", None)
