"""The metric registry: every measurement resdecay reports is one ``Metric`` object, registered once.

``resdecay eval`` (and its raw-pixel / random-init baselines), the per-layer profile, online tracking
during training, ``ablate``'s table, ``compare``, the text reports and the figures all iterate this
registry; none of them names a metric. A new measurement is therefore one file that builds a
``Metric`` and calls ``register_metric`` (imported before the command line is built, e.g. with
``--plugin FILE``): it then appears in ``eval.json``, the report table, ``ablate``'s columns, the
online log and the ``--evals`` choices. The built-in metrics are registered by each pipeline's
``metric(s).py`` (``features/``, ``fid/``, ``diffusion/``, ``segmentation/``).

A ``Metric`` says what is measured: its name, how it is computed, its protocol card, its headline
value (the one number tables, deltas and the online log follow; required, and checked against the
first result the metric returns), its direction, the input it reads, and the options it owns
(``eval/options.py``: ``--metric-option NAME.KEY=VALUE``). How it is shown (label, report text,
column keys, axis titles, table headers) is its ``Display`` (``eval/display.py``).

A metric applies to one kind of input, and the source registered for that kind (``sources.py``) makes it:

* ``features`` (kNN, linear probe, effective rank): a ``FeatureSet``, frozen pooled features of a
  labelled train and test split (``features/source.py``);
* ``layers`` (e.g. CKA between two blocks): a ``LayerSet``, the same test images' pooled features at
  every encoder block (opt-in: such a metric runs when ``--evals`` names it);
* ``blocks`` (token norm, shortcut ratio): a ``BlockStats``, one encoder block's norm statistics;
* ``samples`` (FID): a ``SampleSet``, generated images, reference statistics and an extractor (``fid/source.py``);
* ``diffusion`` (the diffusion probe grid): a ``DiffusionSet``, a diffusion model and labelled images;
* ``segmentation`` (unsupervised segmentation): a ``SegmentationSet``, patch tokens and label maps
  (opt-in: ``--evals segmentation``, since only data sets with label maps can be scored);
* any kind a plugin registers with ``sources.register_source``.

``where`` says which evaluators run it: ``eval`` (one layer), ``profile`` (every layer),
``baselines`` (raw pixels, random init) and ``online`` (during training).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import Registry, RegistryError, UserError, defined_at
from ..io import atomic_write_text
from . import options as opts
from .display import Column, Display, TableSpec
from .inputs import warn, write_failure
from .protocol import MetricSettings
from .sets import BlockStats, FeatureSet, LayerSet
from .sources import (
    BLOCKS,
    DIFFUSION,
    FEATURES,
    LAYERS,
    SAMPLES,
    SEGMENTATION,
    Prepared,
    source_kinds,
)

WHERE = ("eval", "profile", "baselines", "online")


# ----------------------------------------------------------------------------- what metrics read and return
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
class Flag:
    """A command-line flag of ``resdecay eval`` that sets one of its metric's options (``--k`` sets ``knn.k``);
    the CLI builds it from the registry, and a bad value is refused in one line naming the flag.

    Args:
        name: the flag ("--k"); key: the option it sets ("k"); help: its help text.
        switch: a flag without a value that sets True (``--rank-exp``).
        type: an argparse type checking the text first (None: the option's declared type checks it).
        metavar: the value's placeholder in --help.
        choices: the values it takes, refused otherwise in one line naming the flag and them.
    """

    name: str
    key: str
    help: str = ""
    switch: bool = False
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


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
        applies_to: a registered input kind (``sources.source_kinds()``). where: the evaluators that run it (``WHERE``).
        extra_pools: poolings it reads on the test split besides the evaluation's feature (rank: cls).
        options: its own options' defaults: a dataclass instance (typed fields) or a dict (None: none).
        check: ``check(n_train, settings)``: refuse settings that cannot work with ``n_train`` training
            images (kNN: k larger than the bank) before any feature is extracted.
        display: how it is shown (``display.Display``; default: labelled by its name). The column key
            and the reported values default to ``<name>_<headline>`` and the headline.
        flags: the command-line flags that set its options (``Flag``), besides ``--metric-option``.
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
    flags: tuple[Flag, ...] = ()

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
    """Add a metric to the registry: a name another metric holds is refused (``RegistryError``, one
    line) unless ``replace=True``, which swaps out the one of the same name.

    Args:
        metric: the metric.
        replace: allow replacing a registered metric (e.g. a plugin re-imported in a notebook).

    Returns:
        the metric, so a module can write ``RANKME = register_metric(Metric(...))``.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", metric.name):
        raise RegistryError(f"metric name {metric.name!r} must be lower-case letters, digits and _ (it is a key in "
                            "eval.json and an --evals choice)")
    if metric.applies_to not in source_kinds():  # a plugin's new kind registers its source first
        raise RegistryError(f"metric {metric.name!r}: applies_to {metric.applies_to!r} is unknown (no registered input kind); "
                            f"choose one of {', '.join(source_kinds())}, or register_source({metric.applies_to!r}, ...) "
                            "first")
    bad = sorted(set(metric.where) - set(WHERE))
    if bad:
        raise RegistryError(f"metric {metric.name!r}: where {bad[0]!r} is unknown; choose from {', '.join(WHERE)}")
    metrics = Registry("metric", "register_metric", _REGISTRY, origin=lambda m: f"by {defined_at(m.compute)}")
    metrics.check(metric.name, metric, replace)
    try:
        opts.declare(metric.name, metric.options)  # refuses an option type a command line cannot write
    except UserError as e:
        raise RegistryError(str(e)) from None
    return metrics.add(metric.name, metric, replace)


def unregister_metric(name: str) -> None:
    """Remove a metric (tests and notebooks that registered one for a while); ``RegistryError`` if
    none is registered under ``name``."""
    Registry("metric", "register_metric", _REGISTRY).remove(name)
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


def option_flags() -> dict[str, str]:
    """``NAME.KEY`` -> the flag that sets it, of every registered metric (``knn.k`` -> ``--k``)."""
    return {f"{m.name}.{f.key}": f.name for m in _REGISTRY.values() for f in m.flags}


def flag_options(given: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """The options the metrics' own flags set (``{"knn": {"k": "10"}}`` from ``--k 10``), typed and in range,
    a bad value refused in one line naming its flag."""
    for name, keys in (given or {}).items():
        for f in _REGISTRY[name].flags if name in _REGISTRY else ():
            if f.choices and f.key in keys and keys[f.key] not in f.choices:
                raise UserError(f"{f.name} {keys[f.key]!r} is unknown; choose {' or '.join(f.choices)}")
    return opts.checked(given or {}, list(_REGISTRY), option_flags())


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


def cached_rows(file: Path | None) -> list[dict] | None:
    """The rows kept in a ``Prepared.rows_cache`` file, or None (none yet, or unreadable: measured again)."""
    if file is None:
        return None
    try:
        return json.loads(file.read_text())["rows"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep_rows(file: Path | None, key: Any, rows: list[dict]) -> None:
    """Write rows to a ``rows_cache`` file (rank 0; a failure is a warning: it is only a cache)."""
    if file is None or torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(file, json.dumps({"key": key, "rows": rows}, indent=1))
    except OSError as e:
        warn(write_failure(file, e, "the rows are measured anyway, not cached"))


def measure_prepared(metrics: list[Metric], prepared: Prepared, settings: MetricSettings,
                     source: str | None = None) -> tuple[list[dict], dict]:
    """``measure`` of one ``Prepared`` input: its rows read from its ``rows_cache`` when the same input was
    measured under the same protocol before (then no columns), else measured and kept there.

    Args:
        metrics: the metrics; prepared: the input, its layer and card; settings: the protocol;
        source: the baseline's name, or None for the model.
    """
    rows = cached_rows(prepared.rows_cache)
    if rows is not None:
        return rows, {}
    inputs = prepared.inputs() if callable(prepared.inputs) else prepared.inputs  # lazy: made only when measured
    rows, columns = measure(metrics, inputs, settings, prepared.card, prepared.layer, source)
    keep_rows(prepared.rows_cache, prepared.cache_key, rows)
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


__all__ = ["BLOCKS", "DIFFUSION", "FEATURES", "LAYERS", "SAMPLES", "SEGMENTATION", "WHERE",
           "BlockStats", "Column", "Display", "FeatureSet", "Flag", "LayerSet", "Metric", "Result", "TableSpec", "column_metric", "column_title", "get_metric", "cached_rows", "flag_options", "keep_rows", "measure", "measure_prepared", "option_flags",
           "metric_names",
           "register_metric", "registered", "result_row", "row_columns", "unregister_metric"]
