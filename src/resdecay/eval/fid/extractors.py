"""The two feature extractors of FID, never mixed: Inception-v3 (the standard FID: torchmetrics'
NoTrainInceptionV3 with torch-fidelity's FID weights read from a local file, ``--inception-weights``;
nothing is ever downloaded) and resdecay's proxy CNN (``proxy.py``). An extractor is any module; resdecay's
own are ``FeatureExtractor`` subclasses whose ``ExtractorCard`` says what the statistics record."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ...errors import UserError
from ...io import file_sha256, safe_load
from .published import INCEPTION_RESIZE, inception_label

WEIGHTS_FIX = ("pass --inception-weights PATH (the FID Inception file: pytorch-fid's "
               "pt_inception-2015-12-05-6726825d.pth or torch-fidelity's weights-inception-2015-12-05-6726825d.pth)")


def _digest(path: Path) -> str:
    """Short hash of a weights file: stats record it, so a retrained proxy cannot be mixed with old stats."""
    return file_sha256(path)[:12]


def _weights_digest(state_dict: dict) -> str:
    """Short hash of the weights alone: the cache file also holds its training's wall-clock time, so
    hashing the file gave two identical trainings different ids, depending on how busy the machine was."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        h.update(key.encode())
        h.update(state_dict[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


# ----------------------------------------------------------------------------- extractors
@dataclass(frozen=True)
class ExtractorCard:
    """What FID statistics record about the network that made them: two statistics files are
    comparable only when their cards' ``id`` and resolution agree.

    Args:
        name: e.g. ``inception-v3-compat``, ``proxy-cnn-digits-8px``.
        label: the metric's name in reports, e.g. "proxy FID (proxy-cnn-digits-8px)".
        kind: ``inception`` | ``proxy`` | ``custom`` (names the online log's column: ``proxy_fid``).
        resolution: the (C, H, W) images it was trained on; None: any size.
        resize_filter: how images reach its input size.
        needs_rgb: grayscale images are repeated to three channels.
        fingerprint: short hash of its weights file; None: unknown.
    """

    name: str
    label: str
    kind: str = "custom"
    resolution: tuple[int, int, int] | None = None
    resize_filter: str = "none"
    needs_rgb: bool = False
    fingerprint: str | None = None

    @property
    def id(self) -> str:
        """The identity ``feature_stats`` records: the name plus the weights' hash."""
        return f"{self.name}@{self.fingerprint}" if self.fingerprint else self.name


class FeatureExtractor(nn.Module):
    """Base of resdecay's FID extractors: [0, 1] images (B, C, H, W) -> (B, D) features, described by
    ``card``. Any other ``nn.Module`` works too, as an anonymous extractor (``extractor_card``)."""

    card: ExtractorCard

    @property
    def name(self) -> str:
        return self.card.name

    @property
    def label(self) -> str:
        return self.card.label

    @property
    def fingerprint(self) -> str | None:
        return self.card.fingerprint


def extractor_card(extractor: nn.Module) -> ExtractorCard:
    """The card of an extractor; a plain module is named after its class, with no fingerprint."""
    if isinstance(extractor, FeatureExtractor):
        return extractor.card
    name = type(extractor).__name__
    return ExtractorCard(name=name, label=f"proxy FID ({name})")


class InceptionFeatures(FeatureExtractor):
    """[0, 1] images (B, C, H, W) -> (B, 2048) pool features of the FID Inception network."""

    def __init__(self, net: nn.Module, fingerprint: str):
        super().__init__()
        self.net = net
        self.card = ExtractorCard(name="inception-v3-compat", label=inception_label(fingerprint), kind="inception",
                                  resize_filter=INCEPTION_RESIZE, needs_rgb=True, fingerprint=fingerprint)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:  # the network is RGB-only: grayscale is repeated (the stats record it)
            x = x.expand(-1, 3, -1, -1)
        # round, not truncate (torchmetrics' normalize=True truncates): uint8 inputs survive [0, 1] exactly
        return self.net((x * 255).round_().clamp_(0, 255).to(torch.uint8))


def inception_extractor(weights_path: str | os.PathLike | None) -> InceptionFeatures:
    """torchmetrics' NoTrainInceptionV3 (2048 pool features) with weights from a local file only."""
    if not weights_path:
        raise UserError(f"Inception FID needs local weights (nothing is downloaded): {WEIGHTS_FIX}")
    path = Path(weights_path).expanduser()
    if not path.is_file():
        raise UserError(f"Inception weights not found at {path}: {WEIGHTS_FIX}")
    # safe check first: torch-fidelity unpickles freely
    safe_load(path, UserError, f"cannot load Inception weights {path} (not a readable weights file): {WEIGHTS_FIX}")
    from torchmetrics.image.fid import NoTrainInceptionV3

    try:  # antialias=False: torch-fidelity's TF1-compatible bilinear resize, the one published FIDs use
        net = NoTrainInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path=str(path),
                                 antialias=False)
    except ModuleNotFoundError:
        raise UserError("Inception FID needs torch-fidelity: pip install torch-fidelity") from None
    except Exception:
        raise UserError(f"cannot load Inception weights {path} (its keys or shapes are not the FID Inception-v3's): "
                        f"{WEIGHTS_FIX}") from None
    return InceptionFeatures(net, _digest(path))


