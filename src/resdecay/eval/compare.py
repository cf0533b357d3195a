"""``resdecay compare``: put evaluation results of several runs side by side, but only numbers
measured the same way. Two numbers are comparable when their protocol cards are equal (data,
split sizes, layer, feature, k, T, probe recipe, ...); otherwise the comparison is refused with
the differing fields named, or shown with them marked under ``--force``. Which values of a row are
compared is its metric's (``eval/metrics.py``), so a plugin's metric is compared like the built-in ones.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from .metrics import get_metric


def load_report(path: str | Path) -> dict:
    """An eval.json / profile.json, or a run folder holding eval/eval.json (or eval/profile.json)."""
    path = Path(path)
    candidates = [path] if path.is_file() else [path / "eval" / "eval.json", path / "eval.json",
                                                  path / "eval" / "profile.json", path / "profile.json"]
    for c in candidates:
        if c.is_file():
            try:
                report = json.loads(c.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:  # not JSON, or not even UTF-8 text
                raise UserError(f"{c} is not valid UTF-8 JSON ({e}); pass the eval.json written by `resdecay eval`, "
                                "or run it again") from None
            if not isinstance(report, dict) or "results" not in report:
                raise UserError(f"{c} is not a resdecay evaluation (no 'results'); run `resdecay eval` first")
            report["_source"] = str(c)
            return report
    raise UserError(f"{path}: no evaluation found (looked for {', '.join(str(c) for c in candidates)}); "
                    "run `resdecay eval CHECKPOINT` first")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# What was measured, not how: these fields are expected to differ between the runs compared.
SUBJECT_FIELDS = {"checkpoint_sha256", "pretrained", "pretrained_sha256", "pretrained_step"}
# What a selection on validation found (the probes' chosen cell, every cell's validation score) and the shape of the
# tokens it read: outcomes of the same protocol on two models, never a reason to refuse (the grid itself is compared).
OUTCOME_FIELDS = {"chosen", "sweep", "shape"}


def protocol_differences(cards: list[dict]) -> list[str]:
    """Fields whose values differ between protocol cards, as 'field (a vs b)'."""
    flat = [{k: v for k, v in _flatten(c).items() if k.split(".")[-1] not in SUBJECT_FIELDS
             and not OUTCOME_FIELDS & set(k.split("."))} for c in cards]
    keys = sorted(set().union(*flat))
    diffs = []
    for k in keys:
        vals = [f.get(k) for f in flat]
        if any(v != vals[0] for v in vals[1:]):
            diffs.append(f"{k} ({' vs '.join(repr(v) for v in vals)})")
    return diffs


def _compared_values(metric: str, rows) -> list[str]:
    """The values of a metric worth a row: those its registered ``Metric`` reports (kNN: top1, top5), or
    every number for a metric not registered now (a report written with a plugin not loaded)."""
    m = get_metric(metric)
    if m is not None:
        return list(m.display.report_values)
    return list(dict.fromkeys(k for r in rows for k, v in r["values"].items() if isinstance(v, (int, float))))


def compare_reports(reports: list[dict], labels: list[str], force: bool = False) -> dict:
    """Rows ``{name: {label: value}}`` of every measurement present in at least two runs, and the
    protocol differences per row. Raises UserError on differences unless ``force``."""
    by_key: dict[tuple, dict[str, dict]] = {}
    for label, rep in zip(labels, reports, strict=True):
        for r in rep["results"]:
            by_key.setdefault((r["metric"], r["layer"], r["feature"]), {})[label] = r
    rows, differences = {}, {}
    for (metric, layer, feature), entries in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])):
        if len(entries) < 2:
            continue
        diffs = protocol_differences([e["protocol"] for e in entries.values()])
        for value_key in _compared_values(metric, entries.values()):
            vals = {lab: e["values"][value_key] for lab, e in entries.items() if value_key in e["values"]}
            if vals:
                name = f"{metric} {value_key} (layer {layer}, {feature})"
                rows[name] = vals
                if diffs:
                    differences[name] = diffs
    if not rows:
        raise UserError("the runs share no measurement (same metric, layer and feature) to compare")
    if differences and not force:
        first, diffs = next(iter(differences.items()))
        raise UserError(f"refusing to compare numbers measured differently: {first} differs in {'; '.join(diffs[:4])}"
                        f"{' ...' if len(diffs) > 4 else ''}; evaluate with the same settings, or pass --force to show them marked")
    return {"rows": rows, "differences": differences}


def format_comparison(result: dict, labels: list[str]) -> str:
    width = max(12, *(len(lab) for lab in labels))
    name_w = max(len(n) for n in result["rows"]) + 2
    lines = [f"{'measurement':<{name_w}}" + "".join(f"{lab:>{width + 2}}" for lab in labels)]
    for name, vals in result["rows"].items():
        mark = " *" if name in result["differences"] else ""
        cells = "".join(f"{(f'{vals[lab]:.4f}' if lab in vals else '-'):>{width + 2}}" for lab in labels)
        lines.append(f"{name + mark:<{name_w}}{cells}")
    for name, diffs in result["differences"].items():
        lines.append(f"* {name}: protocols differ in {'; '.join(diffs)}")
    return "\n".join(lines)
