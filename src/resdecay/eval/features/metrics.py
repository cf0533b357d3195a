"""The features pipeline's metrics, registered in column order: kNN, linear probe and effective rank
(``features``: eval, profile, baselines, online tracking, ablate's table), then the profile's token norm and
shortcut-to-branch ratio (``blocks``). The linear probe is one metric with two recipes (``protocol.py``): the
IN-100 recipe for one layer, the fast recipe for profiles, online tracking and the diffusion grid.

Each metric declares the options it reads (``eval/options.py``): kNN's k and temperature, the probe's epochs
and feature norm, the rank's form; and the command-line flags that set them (``--k`` is ``knn.k``), which
``resdecay eval`` builds from the registry beside ``--metric-option NAME.KEY=VALUE``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Literal

from ...errors import UserError
from ..display import Column, Display, TableSpec
from ..metrics import BLOCKS, Flag, Metric, Result
from ..options import AT_LEAST_ONE, POSITIVE
from ..protocol import KNN_K, KNN_TEMPERATURE, KNN_VOTE, RANK_FORMS, STATS_CARD, MetricSettings, ProbeRecipe
from ..sets import BlockStats, FeatureSet
from .knn import knn_topk
from .probe import linear_probe
from .rank import effective_rank

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


KNN = Metric(
    name="knn", compute=_knn, protocol=_knn_card, headline="top1", options=KnnOptions(), check=_check_bank,
    flags=(Flag("--k", "k", f"kNN neighbours (default {KNN_K})", type=int),
           Flag("--temperature", "temperature", f"kNN vote temperature (default {KNN_TEMPERATURE})", type=float)),
    display=Display("kNN", describe=lambda p: f"k={p['k']} T={p['temperature']}",
                    titles={"knn_top1": f"kNN top-1 (k={KNN_K}, T={KNN_TEMPERATURE})"}, report_values=("top1", "top5"),
                    table=TableSpec("kNN", "d kNN", "kNN rand", (7, 7))))

PROBE = Metric(
    name="probe", compute=_probe, protocol=lambda s: {"probe": _recipe(s).card()}, headline="top1",
    options=ProbeOptions(),
    flags=(Flag("--probe-epochs", "epochs", "probe epochs (default 200; 30 for --layer all)", type=int),
           Flag("--probe-norm", "feature_norm", "none | batchnorm (default: none for the 200-epoch IN-100 recipe, "
                                                 "batchnorm for --layer all)", choices=("none", "batchnorm"))),
    display=Display("linear probe", describe=_probe_text, titles={"probe_top1": "linear-probe top-1 (fast recipe)"},
                    report_values=("top1", "top5"), table=TableSpec("probe", "d probe", "prb rand", (7, 8))))

RANK = Metric(
    name="rank", compute=_rank, protocol=lambda s: {"form": RANK_FORMS[s.options_of("rank").exp]},
    headline="effective_rank", extra_pools=RANK_EXTRA_POOLS, options=RankOptions(),
    flags=(Flag("--rank-exp", "exp", "report exp(effective rank) (Roy & Vetterli) instead of eq. 6", switch=True),),
    display=Display("effective rank", describe=lambda p: p["form"], column=Column("rank_", by_feature=True),
                    table_feature="cls", table=TableSpec("rank cls", "d rank", None, (8, 7)),
                    titles={f"rank_{p}": f"effective rank (paper eq. 6, {words})" for p, words in POOL_WORDS.items()}))


# ----------------------------------------------------------------------------- blocks (per-layer profile)
def _token_norm(b: BlockStats, s: MetricSettings) -> list[Result]:
    return [Result("tokens", {"feature_norm": b.norms["output"]})]


def _shortcut_ratio(b: BlockStats, s: MetricSettings) -> list[Result]:
    """||alpha x|| / ||f(x)|| of each sub-block: how much of the block's output is the scaled identity."""
    return [Result(br, {"ratio": b.norms[f"shortcut_{br}"] / max(b.norms[f"branch_{br}"], 1e-12)}) for br in BRANCHES]


TOKEN_NORM = Metric(
    name="token_norm", compute=_token_norm, protocol=lambda s: {"norm_statistics": STATS_CARD}, headline="feature_norm",
    applies_to=BLOCKS, where=frozenset({"profile"}),
    display=Display("token norm", describe=lambda p: p["norm_statistics"], column="feature_norm", table_feature=None,
                    titles={"feature_norm": "mean token norm"}, log_scale=True))

SHORTCUT_RATIO = Metric(
    name="shortcut_ratio", compute=_shortcut_ratio, protocol=lambda s: {"norm_statistics": STATS_CARD},
    headline="ratio", applies_to=BLOCKS, where=frozenset({"profile"}),
    display=Display("shortcut / branch", describe=lambda p: p["norm_statistics"], table_feature=None, log_scale=True,
                    column=Column("shortcut_ratio_", by_feature=True),
                    titles={f"shortcut_ratio_{br}": f"||a x|| / ||{br}(x)||" for br in BRANCHES}))

METRICS = (KNN, PROBE, RANK, TOKEN_NORM, SHORTCUT_RATIO,)  # registered by eval/__init__.py, in this order
