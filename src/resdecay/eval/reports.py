"""Text reports of ``eval.json`` / ``profile.json``, read off the metric registry: which values a
row shows and how its protocol reads come from its ``Metric`` (``eval/metrics.py``), so a metric a
plugin registers is reported like the built-in ones. Rows of a metric not registered now (a report
written with a plugin not loaded) are still shown, with every numeric value and no protocol text.
"""

from __future__ import annotations

import math
import textwrap

from .metrics import get_metric


def values_text(row: dict) -> str:
    """A result row's shown values, ``top1 0.7100, top5 0.9300`` (every numeric one for an unregistered metric)."""
    m = get_metric(row["metric"])
    keys = m.display.report_values if m is not None else [k for k, v in row["values"].items() if isinstance(v, (int, float))]
    return ", ".join(f"{k} {row['values'][k]:.4f}" for k in keys if k in row["values"])


def _protocol_text(row: dict) -> str:
    m = get_metric(row["metric"])
    return m.display.describe(row["protocol"]) if m is not None else "-"


def protocol_text(row: dict) -> str:
    """How a result row was measured, in words: data, split sizes and its metric's protocol
    (``digits train 1437 -> test 360; k=20 T=0.07``); the report's protocol column and model cards."""
    p = row["protocol"]
    return f"{p['train']['data']} {_split_text(p)}; {_protocol_text(row)}"


def _split_text(p: dict) -> str:
    """The images a row was measured on: a test-split-only metric (rank) says so in its card."""
    if p.get("split") == "test":
        return f"test {p['test']['images']}"
    return f"train {p['train']['images']} -> test {p['test']['images']}"


def profile_keys(profile: list[dict]) -> list[str]:
    """The columns of a per-layer profile, in the order its rows hold them (registry order)."""
    return list(dict.fromkeys(k for r in profile for k in r if k != "layer"))


def format_report(report: dict) -> str:
    """The report ``resdecay eval`` prints: one line per result with its protocol, or the profile
    table with ``layer="all"``, then the baselines."""
    lines = [f"{report['label']} | {report['checkpoint']} (step {report['step']}, sha256 {report['checkpoint_sha256'][:12]})"]
    if "profile" in report:
        keys = profile_keys(report["profile"])
        lines.append(f"{'layer':>5} " + " ".join(f"{k:>19}" for k in keys))
        for r in report["profile"]:
            lines.append(f"{r['layer']:>5} " + " ".join(f"{r.get(k, math.nan):>19.4f}" for k in keys))
        return "\n".join(lines + _baseline_lines(report))
    w = max([8, *(len(r["metric"]) for r in report["results"])])  # linear_sweep, knn_sweep: the column widens
    lines.append(f"{'metric':<{w}} {'layer':>5} {'feature':<10} {'value':<32} protocol")
    grids = [r for r in report["results"] if _shown_as_grid(r)]
    for r in report["results"]:
        if _shown_as_grid(r):
            continue
        lines.append(f"{r['metric']:<{w}} {r['layer']:>5} {r['feature']:<10} {values_text(r):<32} {protocol_text(r)}")
        lines += detail_lines(r)
    lines += grid_lines(grids)
    if report.get("plugins"):
        lines.append(f"plugins loaded: {', '.join(report['plugins'])}")
    return "\n".join(lines + _baseline_lines(report))


def _shown_as_grid(row: dict) -> bool:
    m = get_metric(row["metric"])
    return m is not None and m.display.grid


def grid_lines(rows: list[dict]) -> list[str]:
    """Rows of ``grid`` metrics as one table per metric: a line per layer, a column per feature, the
    metric's protocol (from its first row) above it."""
    lines = []
    for name in dict.fromkeys(r["metric"] for r in rows):
        own = [r for r in rows if r["metric"] == name]
        features = list(dict.fromkeys(r["feature"] for r in own))
        m = get_metric(name)
        cells = {(r["layer"], r["feature"]): r["values"][m.headline] for r in own}
        lines += [f"{name}: {protocol_text(own[0])}", f"{'layer':>5} " + " ".join(f"{f:>17}" for f in features)]
        for layer in dict.fromkeys(r["layer"] for r in own):
            lines.append(f"{layer:>5} " + " ".join(f"{cells.get((layer, f), math.nan):>17.4f}" for f in features))
    return lines


def detail_lines(row: dict, width: int = 110) -> list[str]:
    """A row's named numbers under it, e.g. segmentation's per-class IoU: ``  iou: background 0.9100, ...``
    (every value that is a mapping of names to numbers), wrapped at ``width``."""
    lines = []
    for key, value in row["values"].items():
        if isinstance(value, dict) and value and all(isinstance(v, (int, float)) for v in value.values()):
            text = ", ".join(f"{name} {v:.4f}" for name, v in value.items())
            lines += textwrap.wrap(text, width, initial_indent=f"  {key}: ", subsequent_indent=" " * (len(key) + 4))
    return lines


def _baseline_lines(report: dict) -> list[str]:
    """Baselines as a short table: what pixels and an untrained encoder already give."""
    rows = report.get("baselines", [])
    if not rows:
        return []
    lines = ["baselines (same protocol): raw pixels and the randomly initialised encoder (seed "
             f"{next((r['protocol'].get('init_seed') for r in rows if 'init_seed' in r['protocol']), '-')})",
             f"{'source':<12} {'metric':<{(w := max([6, *(len(r['metric']) for r in rows)]))}} {'layer':>5} {'feature':<8} value"]
    for r in rows:
        layer = "-" if r["layer"] is None else r["layer"]
        lines.append(f"{r['source']:<12} {r['metric']:<{w}} {layer:>5} {r['feature']:<8} {values_text(r)}")
    return lines
