"""``resdecay eval ... --export-row FILE``: the kNN / linear / EP numbers of each evaluated model as a row of
efficient-probing's ``results.csv`` (the "Probing Frozen Encoders" leaderboard's source table), with the command
that produced them and every protocol that differs from the leaderboard's in ``notes``.

Mapping: ``lp`` is the ``probe`` metric's top-1 (the paper's fixed linear probe) or, when it ran, the swept linear
heads' (``linear_sweep``, chosen on validation); ``ep`` the ``ep`` metric's; ``knn`` the kNN sweep's chosen cell
(``knn_k``, ``knn_T``) or the fixed ``knn`` row; percentages with two decimals, as the leaderboard writes them.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from ...io import atomic_write_text

COLUMNS = ("family,method,arch,pretrain,eval,image_size,lp,lp_gap,ep,ep_queries,ep_variant,model,loader,pretrain_tag,"
           "finetune,lp_variant,lp_log,ep_log,notes,verified,amp,waiting,gap_reason,knn,knn_k,knn_T,knn_log,"
           "extra_flags").split(",")


def _row(report: dict, metric: str, feature: str | None = None) -> dict | None:
    return next((r for r in report["results"] if r["metric"] == metric and (feature is None or r["feature"] == feature)),
                None)


def leaderboard_row(report: dict, command: str) -> dict:
    """One ``results.csv`` row of one evaluation's report (empty cells for what was not measured)."""
    model = report.get("model") or {}
    lp = _row(report, "linear_sweep") or _row(report, "probe")
    ep = _row(report, "ep")
    knn = _row(report, "knn_sweep") or _row(report, "knn")
    pct = lambda r: f"{100 * r['values']['top1']:.2f}" if r else ""  # noqa: E731
    data = (lp or ep or knn or {}).get("protocol", {}).get("train", {}).get("data", "")
    notes = []
    for name, r in (("lp", lp), ("ep", ep), ("knn", knn)):
        if r is not None:
            p = r["protocol"]
            how = p.get("recipe", {}).get("name") or p.get("probe", {}).get("name") or ""
            chosen = p.get("chosen")
            notes.append(f"{name}: {r['metric']}" + (f" {how} recipe" if how else "") +
                         (f", chosen on {p['validation']}: {chosen}" if chosen else ""))
    knn_cell = (knn or {}).get("protocol", {}).get("chosen") or {"k": (knn or {}).get("protocol", {}).get("k", ""),
                                                               "temperature": (knn or {}).get("protocol", {}).get("temperature", "")}
    row = dict.fromkeys(COLUMNS, "")
    arch = (f"ViT {model['embed_dim']}x{model['depth']}/{model['patch_size']}" if {"embed_dim", "depth", "patch_size"} <= set(model)
            else model.get("family", ""))
    row.update(family="MIM", method=report.get("label", ""), arch=arch, pretrain=data, eval=data,
               image_size=model.get("img_size", ""), lp=pct(lp), lp_gap="no", ep=pct(ep),
               ep_queries=(ep or {}).get("protocol", {}).get("queries", ""),
               ep_variant="" if ep is None else ("ep" if ep["protocol"].get("tokens_read") == "patches" else "ep_all"),
               model=report.get("checkpoint") or model.get("source", ""), loader="resdecay",
               lp_variant=(lp or {}).get("feature", ""), notes="; ".join(notes), verified="no", knn=pct(knn),
               knn_k=knn_cell.get("k", ""), knn_T=knn_cell.get("temperature", ""), extra_flags=command)
    return row


def export_rows(reports: list[dict], path: str | Path, command: str) -> Path:
    """Write ``reports``' rows under results.csv's header to ``path`` (atomically)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for report in reports:
        writer.writerow(leaderboard_row(report, command))
    atomic_write_text(Path(path), out.getvalue())
    return Path(path)
