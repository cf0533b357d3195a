"""The metric registry: every measurement resdecay reports is one ``Metric`` object, registered once.

``resdecay eval`` (and its raw-pixel / random-init baselines), the per-layer profile, online tracking
during training, ``ablate``'s table, ``compare``, the text reports and the figures all iterate this
registry; none of them names a metric. A new measurement is therefore one file that builds a
``Metric`` and calls ``register_metric`` (imported before the command line is built, e.g. with
``--plugin FILE``): it then appears in ``eval.json``, the report table, ``ablate``'s columns, the
online log and the ``--evals`` choices. The built-in metrics are registered in ``builtin_metrics.py``.

A metric applies to one kind of input, and each evaluator hands it that input:

* ``features`` (kNN, linear probe, effective rank): a ``FeatureSet``, frozen pooled features of a
  labelled train and test split;
* ``blocks`` (token norm, shortcut ratio): a ``BlockStats``, one encoder block's norm statistics;
* ``samples`` (FID): a ``SampleSet``, generated images, reference statistics and an extractor;
* ``diffusion`` (the diffusion probe grid): a ``DiffusionSet``, a diffusion model and labelled images;
* ``segmentation`` (unsupervised segmentation): a ``SegmentationSet``, patch tokens and label maps
  (opt-in: ``--evals segmentation``, since only data sets with label maps can be scored).

``where`` says which evaluators run it: ``eval`` (one layer), ``profile`` (every layer),
``baselines`` (raw pixels, random init) and ``online`` (during training).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import UserError
from .protocol import MetricSettings

FEATURES, BLOCKS, SAMPLES, DIFFUSION, SEGMENTATION = "features", "blocks", "samples", "diffusion", "segmentation"
KINDS = (FEATURES, BLOCKS, SAMPLES, DIFFUSION, SEGMENTATION)
WHERE = ("eval", "profile", "baselines", "online")


# ----------------------------------------------------------------------------- what metrics read and return
@dataclass
class FeatureSet:
    """What a ``features`` metric reads: one source's pooled features of a labelled train and test split.

    Args:
        train, test: pooling -> (N, D) features. ``train`` holds at least ``feature`` (online tracking extracts
            only that); ``test`` also every pooling a selected metric's ``extra_pools`` asks for, in the order a
            metric reporting every pooling (rank) follows.
        train_labels, test_labels: (N,) class indices.
        feature: the pooling single-feature metrics (kNN, probe) use (``pixels`` for the raw-pixel baseline).
    """

    train: dict[str, torch.Tensor]
    train_labels: torch.Tensor
    test: dict[str, torch.Tensor]
    test_labels: torch.Tensor
    feature: str


@dataclass
class BlockStats:
    """What a ``blocks`` metric reads: mean per-token L2 norms of one encoder block (``output``,
    ``shortcut_attn``, ``branch_attn``, ``shortcut_mlp``, ``branch_mlp``; ``nn.blocks.block_statistics``)."""

    layer: int
    norms: dict[str, float]


@dataclass
class SampleSet:
    """What a ``samples`` metric reads: generated images, the reference statistics and the extractor."""

    samples: Any  # float tensor in [0, 1], uint8 NHWC array or an .npz path (eval.fid reads all three)
    reference: dict
    extractor: torch.nn.Module


@dataclass
class DiffusionSet:
    """What a ``diffusion`` metric reads: a diffusion model and labelled images to probe its blocks with."""

    model: torch.nn.Module
    train_set: Any
    test_set: Any
    levels: tuple[float, ...]


@dataclass
class SegmentationSet:
    """What a ``segmentation`` metric reads: patch tokens (cls dropped) of N images and their label maps.

    Args:
        tokens: (N, T, D), T = grid[0] * grid[1] in raster order; grid: the token grid;
        labels: (N, H, W) class indices, 255 ignored; classes: the number of classes;
        protocol: the segmentation protocol (``eval.segmentation.SegProtocol``);
        keep: where the metric leaves its cluster maps and embedding for figures (None: not kept).
    """

    tokens: torch.Tensor
    grid: tuple[int, int]
    labels: torch.Tensor
    classes: int
    protocol: Any
    keep: dict | None = None


@dataclass
class Result:
    """One measurement.

    Args:
        feature: what it is of: the pooling (mean, cls, pixels), a branch (attn, mlp), an extractor kind.
        values: the numbers, e.g. ``{"top1": 0.71, "top5": 0.93}``.
        card: protocol fields this result adds to its metric's card (e.g. the split it was measured on).
        extra: non-numeric companions for the online log (the diffusion probe's best cell).
    """

    feature: str
    values: dict
    card: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TableSpec:
    """How a metric shows in ``ablate``'s table: the headers of its value, delta and random-init
    columns (None: no random-init column) and the value / delta column widths."""

    header: str
    delta: str
    random: str | None = None
    widths: tuple[int, int] = (7, 7)


# ----------------------------------------------------------------------------- the metric
@dataclass(frozen=True)
class Metric:
    """One measurement, everything the evaluators, reports and figures need to know about it.

    Args:
        name: its name in ``eval.json`` ("metric"), in ``--evals`` and in column keys.
        label: a short human name ("kNN", "linear probe").
        compute: ``compute(inputs, settings) -> list[Result]``; ``inputs`` is the ``applies_to`` kind's
            input (``FeatureSet``, ``BlockStats``, ``SampleSet``, ``DiffusionSet``), ``settings`` a
            ``protocol.MetricSettings``.
        protocol: ``protocol(settings) -> dict``: the metric's own protocol card (k, T, recipe, form);
            the evaluator adds data, split sizes, layer, feature and checkpoint.
        describe: ``describe(card) -> str``: the report's protocol column, from a result's full card.
        headline: the value tables, deltas and the online log follow (e.g. "top1").
        column: the column key of a result, formatted with ``name``, ``headline`` and the result's
            ``feature`` ("{name}_{headline}" -> knn_top1; "rank_{feature}" -> rank_cls, rank_mean).
        table_feature: the feature whose value ``ablate``'s table shows (None: any).
        titles: axis / panel labels per column key (default: the label).
        report_values: the values the text report prints (default: the headline).
        higher_is_better: the direction of a better model; figures say "lower is better" otherwise.
        applies_to: one of ``KINDS``. where: the evaluators that run it (``WHERE``).
        extra_pools: poolings it reads on the test split besides the evaluation's feature (rank: cls).
        log_scale: draw its profile panel on a log axis.
        table: its ``ablate`` columns (default: from the label).
        check: ``check(n_train, settings)``: refuse settings that cannot work with ``n_train`` training
            images (kNN: k larger than the bank) before any feature is extracted.
    """

    name: str
    label: str
    compute: Callable[[Any, MetricSettings], list[Result]]
    protocol: Callable[[MetricSettings], dict]
    describe: Callable[[dict], str]
    headline: str = "top1"
    column: str = "{name}_{headline}"
    table_feature: str | None = "mean"
    titles: Mapping[str, str] = field(default_factory=dict)
    report_values: tuple[str, ...] = ()
    higher_is_better: bool = True
    applies_to: str = FEATURES
    where: frozenset[str] = frozenset(WHERE)
    extra_pools: tuple[str, ...] = ()
    log_scale: bool = False
    table: TableSpec | None = None
    check: Callable[[int, MetricSettings], None] | None = None

    def column_of(self, feature: str) -> str:
        """The column key of a result of this metric about ``feature`` (profile rows, online log, tables)."""
        return self.column.format(name=self.name, headline=self.headline, feature=feature)

    @property
    def key(self) -> str:
        """The column of its ``table_feature``: what ``ablate``'s table and deltas use (knn_top1, probe_top1,
        rank_cls) and the online curve of a samples / diffusion metric (proxy_fid, probe_best_top1)."""
        return self.column_of(self.table_feature or "")

    def columns(self, feature: str, values: Mapping) -> dict:
        """The named number one result gives a profile row, an online log row or a table: ``{column: headline}``."""
        return {self.column_of(feature): values[self.headline]} if self.headline in values else {}

    def title(self, column: str) -> str:
        """Axis / panel label of one of this metric's columns, with its direction when lower is better."""
        text = self.titles.get(column, f"{self.label} ({column})")
        return text if self.higher_is_better or "lower is better" in text else f"{text} (lower is better)"

    def shown_values(self) -> tuple[str, ...]:
        """The values the text report and ``compare`` show."""
        return self.report_values or (self.headline,)

    def table_spec(self) -> TableSpec:
        """Its ``ablate`` columns; by default headed by its label, with no random-init column."""
        if self.table is not None:
            return self.table
        header = self.label[:10]
        return TableSpec(header, f"d {header}", None, (max(7, len(header)), max(7, len(header) + 2)))


# ----------------------------------------------------------------------------- the registry
_REGISTRY: dict[str, Metric] = {}


def register_metric(metric: Metric, replace: bool = False) -> Metric:
    """Add a metric to the registry (``replace=True`` swaps out one of the same name).

    Args:
        metric: the metric.
        replace: allow replacing a registered metric (e.g. a plugin re-imported in a notebook).

    Returns:
        the metric, so a module can write ``RANKME = register_metric(Metric(...))``.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", metric.name):
        raise UserError(f"metric name {metric.name!r} must be lower-case letters, digits and _ (it is a key in "
                        "eval.json and an --evals choice)")
    if metric.applies_to not in KINDS:
        raise UserError(f"metric {metric.name!r}: applies_to {metric.applies_to!r} is unknown; choose one of {', '.join(KINDS)}")
    bad = sorted(set(metric.where) - set(WHERE))
    if bad:
        raise UserError(f"metric {metric.name!r}: where {bad[0]!r} is unknown; choose from {', '.join(WHERE)}")
    if metric.name in _REGISTRY and not replace:
        raise UserError(f"a metric named {metric.name!r} is already registered; pick another name "
                        "(or register_metric(..., replace=True))")
    _REGISTRY[metric.name] = metric
    return metric


def unregister_metric(name: str) -> None:
    """Remove a metric (tests and notebooks that registered one for a while)."""
    _REGISTRY.pop(name, None)


def get_metric(name: str) -> Metric | None:
    """The registered metric of that name, or None (e.g. a report written with a plugin not loaded now)."""
    return _REGISTRY.get(name)


def registered(applies_to: str | None = None, where: str | None = None) -> list[Metric]:
    """Registered metrics in registration order, optionally of one input kind and one evaluator."""
    return [m for m in _REGISTRY.values()
            if (applies_to is None or m.applies_to == applies_to) and (where is None or where in m.where)]


def metric_names(applies_to: str = FEATURES) -> tuple[str, ...]:
    """Names of the registered metrics of one kind: the ``--evals`` choices for ``features``."""
    return tuple(m.name for m in registered(applies_to))


def column_metric(column: str) -> Metric | None:
    """The registered metric whose results have this column key (``online_`` prefix allowed), or None."""
    bare = column.removeprefix("online_")
    for m in _REGISTRY.values():
        parts = m.column.format(name=m.name, headline=m.headline, feature="\0").split("\0")
        if bare in m.titles or re.fullmatch(".+".join(re.escape(p) for p in parts), bare):
            return m
    return None


def column_title(column: str) -> str:
    """The axis / panel label of a column key (``online_`` prefix allowed); the key itself for an unknown one."""
    m = column_metric(column)
    return m.title(column.removeprefix("online_")) if m is not None else column


# ----------------------------------------------------------------------------- rows of eval.json
def result_row(metric: str, layer: int | None, feature: str, values: dict, protocol: dict,
               source: str | None = None) -> dict:
    """One row of ``eval.json``'s ``results`` (or, with ``source``, of its ``baselines``): the only
    place such a row is put together.

    Args:
        metric: the metric's name; layer: the encoder block (None for raw pixels); feature: the pooling;
        values: the numbers; protocol: the full protocol card; source: "pixels" / "random-init" for baselines.
    """
    head = {"metric": metric} if source is None else {"metric": metric, "source": source}
    return {**head, "layer": layer, "feature": feature, "values": values, "protocol": protocol}


def measure(metrics: list[Metric], inputs, settings: MetricSettings, card: dict, layer: int | None,
            source: str | None = None) -> tuple[list[dict], dict]:
    """Run ``metrics`` on one input, in order. Returns (``eval.json`` rows, ``{column: value}`` for a
    profile or online row, with each result's ``extra`` entries).

    Args:
        metrics: the metrics to run; inputs: their input (see ``Metric.compute``); settings: the protocol;
        card: the evaluator's part of every protocol card (data, split sizes, norm, checkpoint);
        layer: the encoder block measured; source: the baseline's name, or None for the model.
    """
    rows, columns = [], {}
    for m in metrics:
        own = m.protocol(settings)
        for r in m.compute(inputs, settings):
            origin = {"source": source} if source is not None else {}
            protocol = {**card, **origin, "layer": layer, "feature": r.feature, **own, **r.card}
            rows.append(result_row(m.name, layer, r.feature, r.values, protocol, source))
            columns.update(m.columns(r.feature, r.values))
            columns.update(r.extra)
    return rows, columns


def row_columns(row: dict, table_only: bool = False) -> dict:
    """``{column: value}`` of one ``eval.json`` row of a registered metric ({} for an unknown one).

    Args:
        row: a ``results`` / ``baselines`` row.
        table_only: keep only the value ``ablate``'s table shows (the metric's ``table_feature``;
            raw pixels have only their pixel vector, which stands in for every pooling).
    """
    m = get_metric(row["metric"])
    if m is None:
        return {}
    if table_only:
        if m.table_feature is not None and row["feature"] not in (m.table_feature, "pixels"):
            return {}
        return {m.key: row["values"][m.headline]} if m.headline in row["values"] else {}
    return m.columns(row["feature"], row["values"])
