"""Model families by name: ``model.family`` in a preset picks the registered family (config class,
constructor, training objective); see ``registry.py``.

Each family registers itself in its own file (``@register_family(...)`` on the model class). This
package imports every module under ``resdecay/models/`` in name order, so a new family is one new
file here and no import line; a family in a user's own file registers when that file is imported
(``resdecay --plugin FILE.py``). The trainer, CLI, evaluators and checkpoints talk to the registry
and to the model contract (``contract.py``: ``ModelConfig``, ``ResidualModel``).

``TINY`` holds each family's smallest named size, the one the contract tests build.
"""

from __future__ import annotations

import importlib
import pkgutil

from .classifier import ClassifierConfig, EncoderClassifier
from .contract import ModelConfig, ResidualModel
from .mae import MAEConfig, MaskedAutoencoder
from .registry import (
    FAMILIES,
    TINY,
    ExampleBatch,
    Family,
    build_model,
    get_family,
    is_diffusion,
    model_config_class,
    register_family,
    tiny_config,
)
from .resnet import ResNetConfig, SupervisedResNet
from .sit import SiT, SiTConfig
from .uvit import UViT, UViTConfig

# The rest of the package's modules, in name order (deterministic registration order); the
# families above are already imported and registered, a new file registers here.
for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["FAMILIES", "ClassifierConfig", "EncoderClassifier", "ExampleBatch", "Family", "MAEConfig", "MaskedAutoencoder",
           "ModelConfig", "ResNetConfig", "ResidualModel", "SiT", "SiTConfig", "SupervisedResNet", "UViT", "UViTConfig",
           "TINY", "build_model", "get_family", "is_diffusion", "model_config_class", "register_family", "tiny_config"]
