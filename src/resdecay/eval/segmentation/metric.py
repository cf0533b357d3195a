"""Unsupervised segmentation (``segmentation``): patch tokens clustered and matched to the label maps,
mIoU with Hungarian matching (the paper's protocol, docs/segmentation.md); opt-in with ``--evals
segmentation``, measured on the model and on its raw-pixel and random-init baselines."""

from __future__ import annotations

import argparse

from ...data.seg_masks import SEG_DATA
from ..display import Display, TableSpec
from ..metrics import SEGMENTATION, Flag, Metric, Result
from ..protocol import MetricSettings
from .segment import SOLVERS, SegProtocol, segment
from .source import SegmentationSet


def seg_data_arg(value: str) -> str:
    """``--seg-data NAME`` or ``NAME:DIR``: the name must be one of ``SEG_DATA``."""
    if value.partition(":")[0] not in SEG_DATA:
        raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(SEG_DATA)} (a folder as NAME:DIR, e.g. "
                                         "folder:my-seg)")
    return value


_DEFAULTS = SegProtocol()
SEG_FLAGS = (
    Flag("--seg-solver", "solver", f"segmentation: {' | '.join(SOLVERS)} (default {_DEFAULTS.solver}: eigenvectors of "
                                   "the kNN graph; learned: the authors' SGD embedding; kmeans: on the tokens)"),
    Flag("--seg-k", "k", "segmentation clusters (default: the number of classes)", type=int),
    Flag("--seg-images", "images", f"segmentation images (default {_DEFAULTS.images})", type=int),
    Flag("--seg-seed", "seed", f"segmentation K-Means / solver seed (default {_DEFAULTS.seed})", type=int),
    Flag("--seg-data", "data", f"label maps from: {' | '.join(SEG_DATA)} (default: the evaluation's data set, which must "
                               "have them); a folder as NAME:DIR, e.g. folder:my-seg (your images/ and labels/, "
                               "docs/segmentation.md), voc:VOC2012, cocostuff27:DIR", type=seg_data_arg,
         metavar="NAME[:DIR]"),
    Flag("--seg-path", "path", "the cocostuff27 / voc / folder folder (or --seg-data NAME:DIR)"),
    Flag("--seg-ignore-index", "ignore_index", "the label value of unlabelled pixels in voc / folder label maps "
                                               f"(default {_DEFAULTS.ignore_index})", type=int))


def _segmentation(x: SegmentationSet, s: MetricSettings) -> list[Result]:
    out = segment(x.tokens, x.grid, x.labels, x.classes, x.protocol, progress=s.progress, names=x.names)
    if x.keep is not None:  # the figures reuse the cluster maps and the embedding
        x.keep.update(out)
    card = {"split": "test", "segmentation": x.protocol.card(), "k": out["k"], "classes": x.classes,
            "token_grid": list(x.grid), "tokens": int(x.tokens.shape[0] * x.tokens.shape[1]),
            "matching": "hungarian (one-to-one, pixel counts; headline) and majority vote",
            "miou": "one dataset-wide confusion matrix, ignored pixels excluded, mean over the classes the scored label "
                    "maps show (a class none shows is left out before clustering: test.absent_classes)",
            "iou": "per class, Hungarian matching, keyed by class name"}
    return [Result("tokens", out["values"], card=card)]


def _segmentation_text(p: dict) -> str:
    g = p["segmentation"]
    graph = "" if g["solver"] == "kmeans" else f", kNN {g['intra']}+{g['inter']} in {g['batch_images']}-image batches"
    absent = p.get("test", {}).get("absent_classes")
    left_out = f"; not in any scored label map (left out of mIoU): {', '.join(absent)}" if absent else ""
    return (f"{g['solver']} solver{graph}, K={p['k']} over {p['classes']} classes, {p['token_grid'][0]}x"
            f"{p['token_grid'][1]} tokens, Hungarian (majority beside), seed {g['seed']}{left_out}")


SEGMENTATION_METRIC = Metric(
    name="segmentation", compute=_segmentation, protocol=lambda s: {}, headline="miou", applies_to=SEGMENTATION,
    where=frozenset({"eval", "baselines"}), options=SegProtocol(),  # segmentation.solver etc. (also --seg-*)
    flags=SEG_FLAGS,
    display=Display("segmentation mIoU", describe=_segmentation_text, table_feature="tokens",
                    report_values=("miou", "pixel_acc", "miou_majority"),
                    titles={"segmentation_miou": "unsupervised segmentation mIoU (Hungarian)"},
                    table=TableSpec("seg mIoU", "d seg", None, (8, 7))))

METRICS = (SEGMENTATION_METRIC,)  # registered by eval/__init__.py, in this order
