"""docs/EXTENDING.md, example (d): a metric over two encoder blocks in one file, registered by importing
it (``resdecay --plugin docs/examples/extending/cka.py eval ... --evals cka``): linear CKA (Kornblith et
al., 2019, "Similarity of Neural Network Representations Revisited", eq. 5 with a linear kernel)
between the evaluated block (``--layer``, the last by default) and a reference block (the option
``cka.reference``, the first by default) on the same test images.

Why it belongs beside the paper's measurements: decayed shortcuts are meant to make the last block's
features *less* like the first block's (more abstract); with plain identity shortcuts the residual
stream keeps much of the early representation. CKA says how much, in one number in [0, 1] that does
not change under an orthogonal transform or an isotropic scaling of either block's features.

A ``layers`` metric gets a ``LayerSet`` (the pooled test features of every block), so reading two
blocks needs no evaluator change; ``--layer all`` gives CKA of every block with the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resdecay.errors import UserError
from resdecay.eval.metrics import LAYERS, Display, LayerSet, Metric, Result, register_metric
from resdecay.eval.protocol import MetricSettings

FORM = "linear CKA (Kornblith et al. 2019): ||Yc'Xc||_F^2 / (||Xc'Xc||_F ||Yc'Yc||_F), features centred over images"


@dataclass(frozen=True)
class CKAOptions:
    """``--metric-option cka.reference=N``: the block the evaluated one is compared with (negative: from the last)."""

    reference: int = 0


@torch.no_grad()
def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of (N, D1) and (N, D2) features of the same N images, in float64.

    With column-centred Xc, Yc: HSIC(K, L) of the linear kernels K = Xc Xc', L = Yc Yc' is ||Yc' Xc||_F^2
    up to a factor that cancels, so CKA = ||Yc' Xc||_F^2 / (||Xc' Xc||_F ||Yc' Yc||_F) (the paper's eq. 5
    with D x D products: cheaper than N x N Gram matrices when N > D)."""
    xc = x.double() - x.double().mean(0)
    yc = y.double() - y.double().mean(0)
    cross = (yc.T @ xc).square().sum()
    norm = torch.linalg.matrix_norm(xc.T @ xc) * torch.linalg.matrix_norm(yc.T @ yc)
    return float(cross / norm) if norm > 0 else 0.0  # a constant block has no similarity to speak of


def _compute(x: LayerSet, s: MetricSettings) -> list[Result]:
    ref, depth = s.options_of("cka").reference, len(x.blocks)
    if not -depth <= ref < depth:
        raise UserError(f"--metric-option cka.reference={ref} is out of range: the encoder has {depth} blocks "
                        f"(0..{depth - 1}, or -1 for the last)")
    ref %= depth
    value = linear_cka(x.blocks[ref], x.blocks[x.layer])
    return [Result(x.feature, {"cka": value}, card={"split": "test", "blocks": [ref, x.layer]})]


CKA = register_metric(Metric(
    name="cka", compute=_compute, headline="cka", applies_to=LAYERS, where=frozenset({"eval", "profile"}),
    protocol=lambda s: {"form": FORM, "reference": s.options_of("cka").reference}, options=CKAOptions(),
    display=Display("linear CKA", describe=lambda card: f"linear CKA of blocks {card['blocks']}", column="cka",
                    titles={"cka": "linear CKA with the reference block (Kornblith et al. 2019)"})),
    replace=True)  # a notebook may import this file twice
