"""docs/EXTENDING.md, example (c): a new metric in one file, registered by importing it (``resdecay --plugin
docs/examples/extending/rankme.py eval ...`` or ``RESDECAY_PLUGINS=...``): RankMe (Garrido et al., 2023,
"RankMe: Assessing the downstream performance of pretrained self-supervised representations by their
rank"), exp of the entropy of the normalised singular values of the (uncentred) test features.

One file, one registration: it then runs in ``resdecay eval`` (and its baselines and per-layer
profile), is logged by online tracking, and gets columns in the report, ``compare`` and ``ablate``.
"""

from __future__ import annotations

import torch

from resdecay.eval.metrics import Display, FeatureSet, Metric, Result, register_metric
from resdecay.eval.protocol import MetricSettings

EPS = 1e-7  # the paper's epsilon: keeps log(p) finite for zero singular values


@torch.no_grad()
def rankme(feats: torch.Tensor) -> float:
    """exp(-sum_k p_k log p_k), p_k = sigma_k / ||sigma||_1 + eps, over the singular values of (N, D) features."""
    s = torch.linalg.svdvals(feats.double())
    p = s / s.sum() + EPS
    return float(torch.exp(-(p * p.log()).sum()))


def _compute(fs: FeatureSet, s: MetricSettings) -> list[Result]:
    return [Result(fs.feature, {"rankme": rankme(fs.test[fs.feature])}, card={"split": "test"})]


RANKME = register_metric(Metric(
    name="rankme", compute=_compute, headline="rankme",
    protocol=lambda s: {"form": "RankMe: exp(entropy of normalised singular values), uncentred", "eps": EPS},
    display=Display("RankMe", describe=lambda card: f"{card['form']}, eps {card['eps']:g}", column="rankme",
                    titles={"rankme": "RankMe (Garrido et al. 2023)"})),
    replace=True)  # a notebook may import this file twice
