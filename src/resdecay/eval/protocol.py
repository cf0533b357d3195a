"""Every evaluation protocol constant, in one place: the kNN vote, the two linear-probe recipes,
the effective-rank forms, the profile's norm statistics and the diffusion probe's noise levels.

A number is comparable with another only when it was measured the same way, so what "the same
way" means lives here once; metrics, reports, figure labels, the CLI's defaults and the notebook
API all read it from this module.

``IN100_RECIPE`` is the authors' ImageNet-100 protocol (paper A.2, paper-notes §4): one Linear
layer, AdamW lr 1e-2 (torch's default weight decay 0.01), batch 1024, 200 epochs, per-iteration
cosine to 0, no augmentation, no feature normalisation. ``FAST_RECIPE`` (per-layer profiles, online
tracking, the diffusion probe grid) takes 30 epochs of batch 256 and standardises features with a
non-affine BatchNorm as MAE's probe does (see ``eval/features/probe.py`` for why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, asdict, dataclass, field
from typing import Any

import torch

from .options import checked_declared, resolve

# ----------------------------------------------------------------------------- kNN (DINO / solo-learn)
KNN_K = 20  # the paper's K
KNN_TEMPERATURE = 0.07  # votes weighted exp(cos / T)
KNN_VOTE = "exp(cos/T)"


# ----------------------------------------------------------------------------- linear probe
@dataclass(frozen=True)
class ProbeRecipe:
    name: str = "in100"
    epochs: int = 200
    batch_size: int = 1024
    lr: float = 1e-2
    weight_decay: float = 0.01  # torch.optim.AdamW's default, which the authors' probe keeps
    schedule: str = "cosine"  # per iteration, to 0, no warmup
    feature_norm: str = "none"  # none | batchnorm (BatchNorm1d without affine, as MAE's probe)
    seed: int = 0

    def card(self) -> dict:
        return asdict(self)


IN100_RECIPE = ProbeRecipe()
FAST_RECIPE = ProbeRecipe(name="fast", epochs=30, batch_size=256, feature_norm="batchnorm")


# ----------------------------------------------------------------------------- attentive probes (eval/probing/)
@dataclass(frozen=True)
class AttentiveRecipe:
    """How an attentive probe (EP, V-JEPA's pooler) is trained on frozen tokens: one head per base learning rate,
    all trained together on the same batches, each kept at its best epoch on the validation split, the best
    base rate chosen on validation too. lr = blr x effective batch / 256 (MAE's rule); the effective batch is
    ``batch_size`` images (gradients accumulated over micro-batches of ``micro_batch``), or the whole training
    split when it is smaller; warmup, then a half-cycle cosine per iteration."""

    name: str
    optimizer: str  # lars (timm's, MAE's rule) | adamw
    blrs: tuple[float, ...]
    batch_size: int
    epochs: int
    warmup_epochs: int
    weight_decay: float
    micro_batch: int = 256
    seed: int = 0

    def card(self) -> dict:
        return asdict(self)


# efficient-probing's ImageNet-1K recipe (main_linprobe.py): LARS, blr 0.1, effective batch 4096, 90 epochs, 10 warmup
EP_RECIPE = AttentiveRecipe("efficient-probing", "lars", (0.1,), 4096, 90, 10, 0.0)
# a few thousand images on a CPU: AdamW over three base rates at batch 256, 30 epochs (3 warmup)
SMALL_ATTENTIVE_RECIPE = AttentiveRecipe("small", "adamw", (1e-3, 3e-3, 1e-2), 256, 30, 3, 0.01)
ATTENTIVE_RECIPES = {r.name: r for r in (EP_RECIPE, SMALL_ATTENTIVE_RECIPE)}
VAL_FRACTION = 0.1  # of the training split, carved (seeded, class-balanced) for every selection; test is never seen

# ----------------------------------------------------------------------------- swept linear heads, kNN sweep, few-shot
SWEEP_LRS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)  # AdamW, the IN-100 recipe's schedule (DINOv2 sweeps lr the same way)
SWEEP_WEIGHT_DECAYS = (0.0, 0.01)
SWEEP_FEATURES = ("cls", "patch_mean", "cls+patch_mean", "cls@last4")  # cls@last4: cls of the last 4 blocks, concatenated
KNN_SWEEP_K = (10, 20, 100, 200)
KNN_SWEEP_T = (0.07, 0.1, 0.2)
FEW_SHOTS = (1, 5, 13)
FEW_SHOT_DRAWS = 3


# ----------------------------------------------------------------------------- effective rank (paper eq. 6)
RANK_FORMS = {False: "entropy of normalised covariance spectrum (paper eq. 6)",
              True: "exp(entropy) (Roy & Vetterli)"}

# ----------------------------------------------------------------------------- per-layer profile
STATS_IMAGES = 512  # test images whose token norms give the profile's norm statistics
STATS_CARD = f"first {STATS_IMAGES} test images, mean per-token L2 norm"

# ----------------------------------------------------------------------------- diffusion probe grid
NOISE_LEVELS = (0.0, 0.1, 0.25, 0.5, 0.75)  # fractions of the diffusion time (0 clean, 1 pure noise)
ONLINE_LEVELS = (0.0, 0.25)  # online tracking: clean and lightly noised, where Table 4's best cells lie


@dataclass(frozen=True)
class MetricSettings:
    """What one evaluation hands every metric's compute, protocol and check functions: where and how
    it runs, and the options set for each metric (each metric declares its own: ``Metric.options``).

    Args:
        probe: this evaluator's linear-probe recipe (IN-100 for one layer, fast for profiles, online
            tracking and the diffusion grid); the probe metric's options (epochs, feature_norm) adjust it.
        device: where probes train and kNN similarities are computed.
        progress: progress bars (the 200-epoch probe shows one).
        options: metric name -> {key: value}, the options set for this evaluation, checked here against each
            declared metric's types and ranges (``options.checked``: one line on a bad value); a metric reads
            its own with ``options_of(name)``, its declared defaults filled in.
        knn_k: shorthand for the option knn.k (online tracking shrinks k to its small bank).
    """

    probe: ProbeRecipe = IN100_RECIPE
    device: str | torch.device = "cpu"
    progress: bool = False
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    knn_k: InitVar[int | None] = None

    def __post_init__(self, knn_k: int | None) -> None:
        given = {name: dict(keys) for name, keys in self.options.items()}
        if knn_k is not None:
            given.setdefault("knn", {}).setdefault("k", knn_k)
        object.__setattr__(self, "options", checked_declared(given))  # each value of its type, in its range

    def options_of(self, name: str) -> Any:
        """Metric ``name``'s options in this evaluation: its declared defaults with the values set here."""
        return resolve(name, self.options.get(name, {}))
