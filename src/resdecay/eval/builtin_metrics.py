"""resdecay's own measurements, each registered once in the metric registry (``eval/metrics.py``).

Registration order is column order: kNN, linear probe and effective rank (``features``: eval, profile,
baselines, online tracking, ablate's table), the profile's token norm and shortcut-to-branch ratio
(``blocks``), and the diffusion families' proxy FID and probe-grid best cell (``samples`` and
``diffusion``: online tracking), then unsupervised segmentation (``segmentation``: eval and its
baselines, opt-in with ``--evals segmentation``). The linear probe is one metric with two recipes (``protocol.py``):
the IN-100 recipe for one layer, the fast recipe for profiles, online tracking and the diffusion grid.

Each metric declares the options it reads (``eval/options.py``): kNN's k and temperature, the probe's
epochs and feature norm, the rank's form, segmentation's protocol (``SegProtocol``). ``resdecay eval``'s
long-standing flags (--k, --temperature, --probe-epochs, --probe-norm, --rank-exp, --seg-*) set them, and so
does ``--metric-option NAME.KEY=VALUE``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Literal

from ..errors import UserError
from .diffusion_probe import probe_grid
from .display import Column, Display, TableSpec
from .fid import compute_fid, extractor_card
from .knn import knn_topk
from .metrics import (
    BLOCKS,
    DIFFUSION,
    SAMPLES,
    SEGMENTATION,
    BlockStats,
    DiffusionSet,
    FeatureSet,
    Metric,
    Result,
    SampleSet,
    SegmentationSet,
    register_metric,
)
from .options import AT_LEAST_ONE, POSITIVE
from .probe import linear_probe
from .protocol import FAST_RECIPE, KNN_K, KNN_TEMPERATURE, KNN_VOTE, RANK_FORMS, STATS_CARD, MetricSettings, ProbeRecipe
from .rank import effective_rank
from .segmentation import SegProtocol, segment

POOL_WORDS = {"mean": "mean-pooled tokens", "cls": "cls tokens", "patch_mean": "mean-pooled patch tokens",
              "pixels": "raw pixels"}  # every pooling of features.POOLINGS, and the raw-pixel baseline
RANK_EXTRA_POOLS = ("cls",)  # the rank is always reported of the cls token too (the paper's Figure 4)
BRANCHES = ("attn", "mlp")


# ----------------------------------------------------------------------------- features
@dataclass(frozen=True)
class KnnOptions:
    """``--metric-option knn.k=N`` / ``knn.temperature=T`` (also ``--k`` / ``--temperature``): k >= 1
    neighbours, votes weighted exp(cos / T) with T > 0 (finite)."""

    k: Annotated[int, AT_LEAST_ONE] = KNN_K
    temperature: Annotated[float, POSITIVE] = KNN_TEMPERATURE


@dataclass(frozen=True)
class ProbeOptions:
    """``probe.epochs`` / ``probe.feature_norm`` (also ``--probe-epochs`` / ``--probe-norm``); None keeps
    the evaluator's recipe's (IN-100 for one layer, fast for the profile and online tracking)."""

    epochs: Annotated[int, AT_LEAST_ONE] | None = None
    feature_norm: Literal["none", "batchnorm"] | None = None


@dataclass(frozen=True)
class RankOptions:
    """``rank.exp=true`` (also ``--rank-exp``): exp(effective rank) (Roy & Vetterli) instead of paper eq. 6."""

    exp: bool = False


def _knn(fs: FeatureSet, s: MetricSettings) -> list[Result]:
    f, o = fs.feature, s.options_of("knn")
    return [Result(f, knn_topk(fs.train[f], fs.train_labels, fs.test[f], fs.test_labels, o.k, o.temperature))]


def _recipe(s: MetricSettings) -> ProbeRecipe:
    """The evaluator's probe recipe with the epochs and feature norm the probe's options set."""
    o, recipe = s.options_of("probe"), s.probe
    if o.epochs:
        recipe = replace(recipe, epochs=o.epochs)
    if o.feature_norm:
        recipe = replace(recipe, feature_norm=o.feature_norm)
    return recipe


def _probe(fs: FeatureSet, s: MetricSettings) -> list[Result]:
    f = fs.feature
    return [Result(f, linear_probe(fs.train[f], fs.train_labels, fs.test[f], fs.test_labels, _recipe(s), s.device,
                                   progress=s.progress))]


def _rank(fs: FeatureSet, s: MetricSettings) -> list[Result]:
    wanted, exp = {fs.feature, *RANK_EXTRA_POOLS}, s.options_of("rank").exp  # in the order the evaluator extracted them
    return [Result(pool, {"effective_rank": effective_rank(x, exp=exp)}, card={"split": "test"})
            for pool, x in fs.test.items() if pool in wanted]


def _probe_text(p: dict) -> str:
    r = p["probe"]
    return f"{r['name']} recipe, {r['epochs']} epochs, lr {r['lr']}, feature norm {r['feature_norm']}"


def _knn_card(s: MetricSettings) -> dict:
    o = s.options_of("knn")
    return {"k": o.k, "temperature": o.temperature, "vote": KNN_VOTE}


def _check_bank(n_train: int, s: MetricSettings) -> None:
    k = s.options_of("knn").k  # k >= 1 is its declared range (KnnOptions), checked where it is set
    if k > n_train:  # before extracting, not after
        raise UserError(f"--k {k} is larger than the kNN bank ({n_train} training images); lower --k")


KNN = register_metric(Metric(
    name="knn", compute=_knn, protocol=_knn_card, headline="top1", options=KnnOptions(), check=_check_bank,
    display=Display("kNN", describe=lambda p: f"k={p['k']} T={p['temperature']}",
                    titles={"knn_top1": f"kNN top-1 (k={KNN_K}, T={KNN_TEMPERATURE})"}, report_values=("top1", "top5"),
                    table=TableSpec("kNN", "d kNN", "kNN rand", (7, 7)))))

PROBE = register_metric(Metric(
    name="probe", compute=_probe, protocol=lambda s: {"probe": _recipe(s).card()}, headline="top1",
    options=ProbeOptions(),
    display=Display("linear probe", describe=_probe_text, titles={"probe_top1": "linear-probe top-1 (fast recipe)"},
                    report_values=("top1", "top5"), table=TableSpec("probe", "d probe", "prb rand", (7, 8)))))

RANK = register_metric(Metric(
    name="rank", compute=_rank, protocol=lambda s: {"form": RANK_FORMS[s.options_of("rank").exp]},
    headline="effective_rank", extra_pools=RANK_EXTRA_POOLS, options=RankOptions(),
    display=Display("effective rank", describe=lambda p: p["form"], column=Column("rank_", by_feature=True),
                    table_feature="cls", table=TableSpec("rank cls", "d rank", None, (8, 7)),
                    titles={f"rank_{p}": f"effective rank (paper eq. 6, {words})" for p, words in POOL_WORDS.items()})))


# ----------------------------------------------------------------------------- blocks (per-layer profile)
def _token_norm(b: BlockStats, s: MetricSettings) -> list[Result]:
    return [Result("tokens", {"feature_norm": b.norms["output"]})]


def _shortcut_ratio(b: BlockStats, s: MetricSettings) -> list[Result]:
    """||alpha x|| / ||f(x)|| of each sub-block: how much of the block's output is the scaled identity."""
    return [Result(br, {"ratio": b.norms[f"shortcut_{br}"] / max(b.norms[f"branch_{br}"], 1e-12)}) for br in BRANCHES]


TOKEN_NORM = register_metric(Metric(
    name="token_norm", compute=_token_norm, protocol=lambda s: {"norm_statistics": STATS_CARD}, headline="feature_norm",
    applies_to=BLOCKS, where=frozenset({"profile"}),
    display=Display("token norm", describe=lambda p: p["norm_statistics"], column="feature_norm", table_feature=None,
                    titles={"feature_norm": "mean token norm"}, log_scale=True)))

SHORTCUT_RATIO = register_metric(Metric(
    name="shortcut_ratio", compute=_shortcut_ratio, protocol=lambda s: {"norm_statistics": STATS_CARD},
    headline="ratio", applies_to=BLOCKS, where=frozenset({"profile"}),
    display=Display("shortcut / branch", describe=lambda p: p["norm_statistics"], table_feature=None, log_scale=True,
                    column=Column("shortcut_ratio_", by_feature=True),
                    titles={f"shortcut_ratio_{br}": f"||a x|| / ||{br}(x)||" for br in BRANCHES})))


# ----------------------------------------------------------------------------- diffusion models
def _fid(x: SampleSet, s: MetricSettings) -> list[Result]:
    r = compute_fid(x.samples, x.reference, x.extractor, device=s.device)
    return [Result(extractor_card(x.extractor).kind, {"value": r["value"]}, card={**r["protocol"], "label": r["label"]})]


def _best_probe_cell(x: DiffusionSet, s: MetricSettings) -> list[Result]:
    best = probe_grid(x.model, x.train_set, x.test_set, levels=x.levels, device=s.device, progress=False)["best"]
    return [Result("mean", {"top1": best["top1"]}, card={"levels": list(x.levels)},
                   extra={"probe_best_cell": {"block": best["layer"], "noise": best["level"]}})]


FID = register_metric(Metric(
    name="fid", compute=_fid, protocol=lambda s: {}, headline="value", higher_is_better=False, applies_to=SAMPLES,
    where=frozenset({"online"}),
    display=Display("FID", describe=lambda p: p["label"], column=Column(suffix="_fid", by_feature=True),
                    table_feature="proxy",
                    titles={"proxy_fid": "proxy FID of EMA samples", "inception_fid": "FID of EMA samples"})))

DIFFUSION_PROBE = register_metric(Metric(
    name="diffusion_probe", compute=_best_probe_cell, protocol=lambda s: {"probe": FAST_RECIPE.card()}, headline="top1",
    applies_to=DIFFUSION, where=frozenset({"online"}),
    display=Display("best probe cell", describe=lambda p: f"fast probe, best of blocks x noise levels {p['levels']}",
                    column="probe_best_top1", titles={"probe_best_top1": "best probe cell top-1 (block x noise level)"})))


# ----------------------------------------------------------------------------- unsupervised segmentation
def _segmentation(x: SegmentationSet, s: MetricSettings) -> list[Result]:
    out = segment(x.tokens, x.grid, x.labels, x.classes, x.protocol, progress=s.progress, names=x.names)
    if x.keep is not None:  # the figures reuse the cluster maps and the embedding
        x.keep.update(out)
    card = {"split": "test", "segmentation": x.protocol.card(), "k": out["k"], "classes": x.classes,
            "token_grid": list(x.grid), "tokens": int(x.tokens.shape[0] * x.tokens.shape[1]),
            "matching": "hungarian (one-to-one, pixel counts; headline) and majority vote",
            "miou": "one dataset-wide confusion matrix, ignored pixels excluded, mean over all classes (empty union = 0)",
            "iou": "per class, Hungarian matching, keyed by class name"}
    return [Result("tokens", out["values"], card=card)]


def _segmentation_text(p: dict) -> str:
    g = p["segmentation"]
    graph = "" if g["solver"] == "kmeans" else f", kNN {g['intra']}+{g['inter']} in {g['batch_images']}-image batches"
    return (f"{g['solver']} solver{graph}, K={p['k']} over {p['classes']} classes, {p['token_grid'][0]}x"
            f"{p['token_grid'][1]} tokens, Hungarian (majority beside), seed {g['seed']}")


SEGMENTATION_METRIC = register_metric(Metric(
    name="segmentation", compute=_segmentation, protocol=lambda s: {}, headline="miou", applies_to=SEGMENTATION,
    where=frozenset({"eval", "baselines"}), options=SegProtocol(),  # segmentation.solver etc. (also --seg-*)
    display=Display("segmentation mIoU", describe=_segmentation_text, table_feature="tokens",
                    report_values=("miou", "pixel_acc", "miou_majority"),
                    titles={"segmentation_miou": "unsupervised segmentation mIoU (Hungarian)"},
                    table=TableSpec("seg mIoU", "d seg", None, (8, 7)))))
