"""How a metric is shown, kept apart from what it measures (``eval/metrics.py``): its label, the
report's protocol text, the key of its column in profile rows, the online log and ``ablate``'s
table, the axis titles of its figures and its table headers.

A column key is built from plain parts, not a format template, so finding the metric of a key read
back from a log (``online_rank_cls``) is a prefix / suffix test, not a regular expression.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Column:
    """The key of a metric's column: one fixed key (``Column("knn_top1")``), or one per result
    feature between ``prefix`` and ``suffix`` (``Column("rank_", by_feature=True)`` -> rank_cls,
    rank_mean; ``Column(suffix="_fid", by_feature=True)`` -> proxy_fid, inception_fid)."""

    prefix: str = ""
    suffix: str = ""
    by_feature: bool = False

    def of(self, feature: str) -> str:
        """The key of a result about ``feature``."""
        return f"{self.prefix}{feature}{self.suffix}" if self.by_feature else self.prefix + self.suffix

    def holds(self, key: str) -> bool:
        """Whether ``key`` is one of this column's keys (a per-feature key has a non-empty feature)."""
        if not self.by_feature:
            return key == self.prefix + self.suffix
        return (len(key) > len(self.prefix) + len(self.suffix) and key.startswith(self.prefix)
                and key.endswith(self.suffix))


@dataclass(frozen=True)
class TableSpec:
    """How a metric shows in ``ablate``'s table: the headers of its value, delta and random-init
    columns (None: no random-init column) and the value / delta column widths."""

    header: str
    delta: str
    random: str | None = None
    widths: tuple[int, int] = (7, 7)


def no_text(card: dict) -> str:
    """The protocol text of a metric that gives none."""
    return ""


@dataclass(frozen=True)
class Display:
    """Everything about showing one metric.

    Args:
        label: a short human name ("kNN", "linear probe").
        describe: ``describe(card) -> str``: the report's protocol column, from a result's full card.
        column: the key of its column (a ``Column``, or a string for one fixed key; default
            ``<name>_<headline>``, filled in by the ``Metric``).
        table_feature: the feature whose value ``ablate``'s table shows (None: any).
        titles: axis / panel labels per column key (default: the label).
        report_values: the values the text report and ``compare`` print (default: the headline).
        log_scale: draw its profile panel on a log axis.
        table: its ``ablate`` columns (default: headed by the label, no random-init column).
        grid: the text report shows its rows as one table, a line per layer and a column per feature
            (the diagnostics' many quantities per block), not a line per row.
    """

    label: str
    describe: Callable[[dict], str] = no_text
    column: Column | str | None = None
    table_feature: str | None = "mean"
    titles: Mapping[str, str] = field(default_factory=dict)
    report_values: tuple[str, ...] = ()
    log_scale: bool = False
    table: TableSpec | None = None
    grid: bool = False
    filled: frozenset[str] = field(default=frozenset(), repr=False, compare=False)  # defaults ``completed`` set

    def completed(self, name: str, headline: str) -> Display:
        """This display with the defaults that follow from the metric's name and headline filled in (and
        filled in afresh when a metric is copied with another name or headline)."""
        unset = {"column": None, "report_values": (), "table": None}
        own = {k: unset[k] if k in self.filled else getattr(self, k) for k in unset}
        header = self.label[:10]
        default = {"column": Column(f"{name}_{headline}"), "report_values": (headline,),
                   "table": TableSpec(header, f"d {header}", None, (max(7, len(header)), max(7, len(header) + 2)))}
        filled = frozenset(k for k, v in own.items() if v == unset[k])
        value = {k: default[k] if k in filled else v for k, v in own.items()}
        column = Column(value["column"]) if isinstance(value["column"], str) else value["column"]
        return replace(self, column=column, report_values=value["report_values"], table=value["table"], filled=filled)

    def column_of(self, feature: str) -> str:
        """The column key of a result about ``feature`` (profile rows, online log, tables)."""
        return self.column.of(feature)

    @property
    def key(self) -> str:
        """The column of its ``table_feature``: what ``ablate``'s table and deltas use (knn_top1, probe_top1,
        rank_cls) and the online curve of a samples / diffusion metric (proxy_fid, probe_best_top1)."""
        return self.column_of(self.table_feature or "")

    def holds(self, key: str) -> bool:
        """Whether ``key`` (without the online log's ``online_`` prefix) is one of its columns."""
        return key in self.titles or self.column.holds(key)

    def title(self, column: str, higher_is_better: bool = True) -> str:
        """Axis / panel label of one of its columns, with its direction when lower is better."""
        text = self.titles.get(column, f"{self.label} ({column})")
        return text if higher_is_better or "lower is better" in text else f"{text} (lower is better)"
