"""The flags metrics declare (``Metric.flags``: ``--k`` sets ``knn.k``), built into a parser from the metric
registry, as ``--evals`` takes its choices from it. Each flag stores its text under
``args.metric_flags[metric][key]``; the evaluation checks the values against the metric's declared option
types and ranges and names the flag in the one-line error (``eval.options.checked``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from ..eval.metrics import Metric


class MetricFlag(argparse.Action):
    """One metric option's flag: stores ``{metric: {key: value}}`` in ``namespace.metric_flags``."""

    def __init__(self, option_strings, dest, metric: str = "", key: str = "", switch: bool = False, **kwargs):
        super().__init__(option_strings, dest, nargs=0 if switch else None, **kwargs)
        self.metric, self.key, self.switch = metric, key, switch

    def __call__(self, parser, namespace, values, option_string=None):
        given = dict(getattr(namespace, self.dest, None) or {})
        given[self.metric] = {**given.get(self.metric, {}), self.key: True if self.switch else values}
        setattr(namespace, self.dest, given)


def add_metric_flags(parser: argparse.ArgumentParser, metrics: Iterable[Metric]) -> None:
    """Every flag the given metrics declare, in registry order; the values land in ``args.metric_flags``."""
    parser.set_defaults(metric_flags=None)
    for m in metrics:
        for f in m.flags:
            extra = {} if f.switch else {"type": f.type or str, "metavar": f.metavar or f.key.upper()}
            parser.add_argument(f.name, action=MetricFlag, dest="metric_flags", metric=m.name, key=f.key,
                                switch=f.switch, help=f"{f.help} [{m.name}.{f.key}]", default=argparse.SUPPRESS, **extra)
