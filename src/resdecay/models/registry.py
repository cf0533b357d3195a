"""Model families by name, registered where they are defined (timm's ``register_model``).

``model.family`` in a preset picks the registered family: its config class, its constructor, its
training objective and what the generic code needs to know about it. A family registers with one
call in its own file, as a decorator on the model class::

    @register_family("mae", config=MAEConfig, objective=mae_objective, tiny=TINY_MAE)
    class MaskedAutoencoder(ViTEncoder): ...

Every module under ``resdecay/models/`` is imported by the package (``models/__init__.py``), so a
new file there is found without an import line; a family in a user's own file registers when that
file is imported before the command line builds the model (``resdecay --plugin my_family.py ...``).
The trainer, the CLI, checkpoints and the contract test only talk to this table.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch
import torch.nn as nn

from ..errors import ConfigError, Registry, RegistryError, defined_at
from ..nn.checkpointing import set_grad_checkpointing
from .contract import ModelConfig, missing_members

# (model, images, labels) -> scalar loss; called on the wrapped (DDP / compiled) model, so it must
# go through the model's forward
Objective = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ExampleBatch:
    """A batch a family's model takes: ``model.forward_intermediates(images, *conditioning)`` and
    ``objective(model, images, labels)``."""
    images: torch.Tensor
    conditioning: tuple = ()  # diffusion backbones: (t, y)
    labels: torch.Tensor | None = None


def image_batch(model: nn.Module, batch: int) -> ExampleBatch:
    """Random images of the model's input size and two-class labels: what image encoders and
    classifiers take."""
    cfg = model.cfg
    return ExampleBatch(torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size), (), torch.arange(batch) % 2)


@dataclass(frozen=True)
class Family:
    """One registered model family.

    Args:
        config: the config dataclass (a ``ModelConfig``); ``model.*`` settings are its fields.
        build: ``build(config) -> model``, a ``ResidualModel``.
        objective: the training loss, ``objective(model, images, labels) -> scalar``.
        param_groups: ``(model, weight_decay) -> optimizer groups`` (each may carry an "lr_scale");
            None = the default split (no weight decay on biases and 1-D parameters).
        tiny: keyword arguments of ``config`` for the family's smallest size (contract tests build it).
        diffusion: trains with a diffusion objective: it samples, is scored by FID, and its
            ``forward_intermediates`` takes ``(x, t, y)``.
        example_batch: ``(model, batch) -> ExampleBatch``: inputs the model takes (contract tests).
        name: the name it is registered under.
    """
    config: type
    build: Callable[[Any], nn.Module]
    objective: Objective
    param_groups: Callable[[nn.Module, float], list[dict]] | None = None
    tiny: Mapping[str, Any] = field(default_factory=dict)
    diffusion: bool = False
    example_batch: Callable[[nn.Module, int], ExampleBatch] = image_batch
    name: str = ""

    def tiny_config(self):
        """A fresh config at the family's tiny size."""
        return self.config(**copy.deepcopy(dict(self.tiny)))


FAMILIES: dict[str, Family] = {}
_FAMILIES = Registry("model family", "register_family", FAMILIES, origin=lambda f: f"by {defined_at(f.build)}",
                     same=lambda old, new: old.build is new.build)


def register_family(name: str, *, config: type, objective: Objective, build: Callable[[Any], nn.Module] | None = None,
                    param_groups: Callable[[nn.Module, float], list[dict]] | None = None, tiny: Mapping[str, Any] | None = None,
                    diffusion: bool = False, example_batch: Callable[[nn.Module, int], ExampleBatch] = image_batch,
                    replace: bool = False):
    """Register a model family under ``name`` (``model.family=name``).

    Used as a decorator on the model class (``build`` defaults to the class), or called with
    ``build=`` given. Returns the decorated class (or ``build``) unchanged.

    Args:
        name: the ``model.family`` value; a name another constructor holds is refused (``RegistryError``).
        config: the config dataclass; it must subclass ``ModelConfig`` and its ``family`` field must
            default to ``name`` (a preset that omits ``model.family`` still rebuilds the family).
        objective, build, param_groups, tiny, diffusion, example_batch: see ``Family``.
        replace: replace the family registered under ``name``.
    """
    def register(constructor):
        check_registration(name, config)
        _FAMILIES.add(name, Family(config, constructor, objective, param_groups, dict(tiny or {}), diffusion,
                                   example_batch, name), replace)
        return constructor

    return register if build is None else register(build)


def unregister_family(name: str) -> Family:
    """Remove the family registered under ``name`` (``RegistryError`` if there is none); returns it."""
    return _FAMILIES.remove(name)


def check_registration(name: str, config: type) -> None:
    """One line for a registration that would break later: a config that is not a ``ModelConfig``
    dataclass, or one whose ``family`` default is another name (a taken name: ``Registry.add``)."""
    if not (isinstance(config, type) and issubclass(config, ModelConfig) and dataclasses.is_dataclass(config)):
        raise RegistryError(f"model family {name!r}: config {config!r} must be a dataclass subclassing "
                            "resdecay.models.ModelConfig")
    family = next((f for f in dataclasses.fields(config) if f.name == "family"), None)
    if family is None or family.default != name:
        raise RegistryError(f"model family {name!r}: {config.__name__} needs a field `family: str = {name!r}`")


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def model_config_class(family: str) -> type:
    return get_family(family).config


def build_model(cfg: ModelConfig) -> nn.Module:
    """Build the model a model config describes (``cfg.family`` picks the constructor); a model that
    lacks a member of the contract is refused here, in one line, not by the trainer later."""
    model = get_family(cfg.family).build(cfg)
    if getattr(cfg, "grad_checkpointing", False):  # a family that has the switch (the transformer families)
        set_grad_checkpointing(model, True)
    missing = missing_members(model)
    if missing:
        raise ConfigError(f"model family {cfg.family!r}: {type(model).__name__} lacks {', '.join(missing)}; add them, "
                          "the model contract (resdecay.models.ResidualModel, models/contract.py) needs them")
    return model


def tiny_config(family: str) -> ModelConfig:
    """A fresh config of ``family`` at its tiny size."""
    return get_family(family).tiny_config()


def is_diffusion(family: str) -> bool:
    """Whether a family trains with a diffusion objective (U-ViT, SiT): it samples, and is scored by FID."""
    return family in FAMILIES and FAMILIES[family].diffusion


class TinySizes(Mapping):
    """``TINY[name]``: each registered family's tiny config arguments (a live view of the registry)."""

    def __getitem__(self, name: str) -> dict:
        return dict(get_family(name).tiny)

    def __iter__(self):
        return iter(FAMILIES)

    def __len__(self) -> int:
        return len(FAMILIES)


TINY = TinySizes()
