"""The metric registry: every measurement resdecay reports is one ``Metric`` object, registered once.

``resdecay eval`` (and its raw-pixel / random-init baselines), the per-layer profile, online tracking
during training, ``ablate``'s table, ``compare``, the text reports and the figures all iterate this
registry; none of them names a metric. A new measurement is therefore one file that builds a
``Metric`` and calls ``register_metric`` (imported before the command line is built, e.g. with
``--plugin FILE``): it then appears in ``eval.json``, the report table, ``ablate``'s columns, the
online log and the ``--evals`` choices. The built-in metrics are registered in ``builtin_metrics.py``.

A ``Metric`` says what is measured: its name, how it is computed, its protocol card, its headline
value (the one number tables, deltas and the online log follow; required, and checked against the
first result the metric returns), its direction, the input it reads, and the options it owns
(``eval/options.py``: ``--metric-option NAME.KEY=VALUE``). How it is shown (label, report text,
column keys, axis titles, table headers) is its ``Display`` (``eval/display.py``).

A metric applies to one kind of input, and each evaluator hands it that input:

* ``features`` (kNN, linear probe, effective rank): a ``FeatureSet``, frozen pooled features of a
  labelled train and test split;
* ``layers`` (e.g. CKA between two blocks): a ``LayerSet``, the same test images' pooled features at
  every encoder block (opt-in: such a metric runs when ``--evals`` names it);
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
from . import options as opts
from .display import Column, Display, TableSpec
from .protocol import MetricSettings

FEATURES, LAYERS, BLOCKS, SAMPLES, DIFFUSION, SEGMENTATION = ("features", "layers", "blocks", "samples", "diffusion",
                                                              "segmentation")
KINDS = (FEATURES, LAYERS, BLOCKS, SAMPLES, DIFFUSION, SEGMENTATION)
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
class LayerSet:
    """What a ``layers`` metric reads: the same test images' pooled features at every encoder block,
    so that a metric over two blocks (CKA between the first and the last) is one function.

    Args:
        layer: the block being evaluated (``--layer``; each block in turn for the profile).
        blocks: block index -> (N, D) test features of the evaluation's pooling, every block of the encoder.
        labels: (N,) class indices of the test images.
        feature: the pooling (``--feature``).
    """

    layer: int
    blocks: dict[int, torch.Tensor]
    labels: torch.Tensor
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
        keep: where the metric leaves its cluster maps and embedding for figures (None: not kept);
        names: the class names (label i is names[i]; None: unknown).
    """

    tokens: torch.Tensor
    grid: tuple[int, int]
    labels: torch.Tensor
    classes: int
    protocol: Any
    keep: dict | None = None
    names: tuple[str, ...] | None = None


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



# ----------------------------------------------------------------------------- the metric
@dataclass(frozen=True)
class Metric:
    """One measurement: what it measures, on which input, in which evaluators, and how it is shown.

    Args:
        name: its name in ``eval.json`` ("metric"), in ``--evals`` and ``--metric-option NAME.KEY=VALUE``.
        compute: ``compute(inputs, settings) -> list[Result]``; ``inputs`` is the ``applies_to`` kind's
            input (``FeatureSet``, ``LayerSet``, ``BlockStats``, ...), ``settings`` a ``protocol.MetricSettings``
            (its own options: ``settings.options_of(name)``).
        protocol: ``protocol(settings) -> dict``: the metric's own protocol card (k, T, recipe, form);
            the evaluator adds data, split sizes, layer, feature and checkpoint.
        headline: the value tables, deltas and the online log follow (e.g. "top1"); every result must
            hold it, which the first result of every run is checked for.
        higher_is_better: the direction of a better model; figures say "lower is better" otherwise.
        applies_to: one of ``KINDS``. where: the evaluators that run it (``WHERE``).
        extra_pools: poolings it reads on the test split besides the evaluation's feature (rank: cls).
        options: its own options' defaults: a dataclass instance (typed fields) or a dict (None: none).
        check: ``check(n_train, settings)``: refuse settings that cannot work with ``n_train`` training
            images (kNN: k larger than the bank) before any feature is extracted.
        display: how it is shown (``display.Display``; default: labelled by its name). The column key
            and the reported values default to ``<name>_<headline>`` and the headline.
    """

    name: str
    compute: Callable[[Any, MetricSettings], list[Result]]
    protocol: Callable[[MetricSettings], dict]
    headline: str
    higher_is_better: bool = True
    applies_to: str = FEATURES
    where: frozenset[str] = frozenset(WHERE)
    extra_pools: tuple[str, ...] = ()
    options: Any = None
    check: Callable[[int, MetricSettings], None] | None = None
    display: Display | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.headline, str) or not self.headline:
            raise UserError(f"metric {self.name!r}: headline must name the value its tables follow (e.g. 'top1')")
        shown = self.display if self.display is not None else Display(self.name)
        object.__setattr__(self, "display", shown.completed(self.name, self.headline))

    def columns(self, feature: str, values: Mapping) -> dict:
        """The named number one result gives a profile row, an online log row or a table: ``{column: headline}``."""
        return {self.display.column_of(feature): values[self.headline]} if self.headline in values else {}

    def check_headline(self, result: Result) -> None:
        """One line when a result lacks the headline: the metric would otherwise have no column anywhere."""
        if self.headline not in result.values:
            got = ", ".join(map(str, result.values)) or "no values"
            raise UserError(f"metric {self.name!r} returned a result without its headline {self.headline!r} "
                            f"(it returned {got}): return {self.headline!r} in every result's values, or "
                            f"register the metric with headline= one of the keys it returns")


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
    opts.declare(metric.name, metric.options)  # refuses an option type a command line cannot write
    _REGISTRY[metric.name] = metric
    return metric


def unregister_metric(name: str) -> None:
    """Remove a metric (tests and notebooks that registered one for a while)."""
    _REGISTRY.pop(name, None)
    opts.forget(name)


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
    return next((m for m in _REGISTRY.values() if m.display.holds(bare)), None)


def column_title(column: str) -> str:
    """The axis / panel label of a column key (``online_`` prefix allowed); the key itself for an unknown one."""
    m = column_metric(column)
    return m.display.title(column.removeprefix("online_"), m.higher_is_better) if m is not None else column


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
        results = m.compute(inputs, settings)
        if results:
            m.check_headline(results[0])
        for r in results:
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
        d = m.display
        if d.table_feature is not None and row["feature"] not in (d.table_feature, "pixels"):
            return {}
        return {d.key: row["values"][m.headline]} if m.headline in row["values"] else {}
    return m.columns(row["feature"], row["values"])


__all__ = ["BLOCKS", "DIFFUSION", "FEATURES", "KINDS", "LAYERS", "SAMPLES", "SEGMENTATION", "WHERE", "BlockStats",
           "Column", "DiffusionSet", "Display", "FeatureSet", "LayerSet", "Metric", "Result", "SampleSet",
           "SegmentationSet", "TableSpec", "column_metric", "column_title", "get_metric", "measure", "metric_names",
           "register_metric", "registered", "result_row", "row_columns", "unregister_metric"]
