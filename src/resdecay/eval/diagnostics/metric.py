"""Residual-stream diagnostics as an evaluation metric (``--evals diagnostics``): per block, what the identity
path carries (the direct path's share of the stream), how much pixel detail its tokens hold (ridge R^2 of the
pixels and of their high frequencies), shortcut vs branch, and what removing the block's branch costs.
One result per quantity and block; with ``--layer all`` they are columns of the per-layer profile."""

from __future__ import annotations

from ..display import Column, Display, TableSpec
from ..metrics import Flag, Metric, Result
from ..protocol import MetricSettings
from .source import DIAGNOSTICS, DiagnosticsLayer, DiagnosticsOptions

TITLES = {f"diag_{k}": v for k, v in {
    "direct_share": "direct path's share of the stream (projection)",
    "direct_share_centred": "direct path's share of the variance across images",
    "direct_energy": "direct path's energy / stream energy",
    "pixel_r2": "pixel R^2 from the block's tokens (ridge, test images)",
    "high_freq_r2": "high-frequency pixel R^2 from the block's tokens",
    "shortcut_ratio": "||alpha x|| / ||f(x)|| (mean of its sub-blocks)",
    "branch_cosine": "cos(alpha x, f(x)) (mean of its sub-blocks)",
    "knockout_change": "relative change of the last layer's pooled feature, branch removed",
    "knockout_knn_drop": "kNN top-1 lost when the block's branch is removed",
}.items()}


def _diagnostics(x: DiagnosticsLayer, s: MetricSettings) -> list[Result]:
    return [Result(name, {"value": value}) for name, value in x.values.items()]


def _describe(card: dict) -> str:
    o = card["diagnostics"]
    return (f"{card['test_images']} test / {card['train_images']} train images, ridge {o['ridge']:g} on "
            f"{o['pixel_patches'] or 'all'} patches per image, knock-out on {o['knockout_images']}, pool {card['pool']}")


DIAGNOSTICS_METRIC = Metric(
    name=DIAGNOSTICS, compute=_diagnostics, protocol=lambda s: {}, headline="value", applies_to=DIAGNOSTICS,
    where=frozenset({"eval", "profile"}), options=DiagnosticsOptions(),
    flags=(Flag("--diag-images", "images", "diagnostics: test images (default 1000)", type=int),
           Flag("--diag-train-images", "train_images", "diagnostics: train images of the pixel ridge and the kNN "
                                                       "bank (default 1000)", type=int),
           Flag("--knockout-images", "knockout_images", "diagnostics: images the knock-out runs on (default 256)",
                type=int)),
    display=Display("residual-stream diagnostics", describe=_describe, column=Column("diag_", by_feature=True),
                    table_feature="direct_share", titles=TITLES, grid=True,
                    table=TableSpec("direct", "d direct", None, (7, 9))))

METRICS = (DIAGNOSTICS_METRIC,)  # registered by eval/__init__.py, in this order
