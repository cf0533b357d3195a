"""The residual-stream diagnostics as one PNG of per-layer curves, one line per model (plain vs decayed
overlaid): the direct path's share of the stream, the pixel and high-frequency R^2 of each layer's tokens,
shortcut / branch per sub-block, and the knock-out. Reads ``diagnose``'s report (``eval.json["diagnostics"]``)."""

from __future__ import annotations

import math
from pathlib import Path

from ..eval.diagnostics.source import DiagnosticsOptions, diagnose_data
from .backend import plt
from .plots import save_panels

# what the demo and ``resdecay figures`` measure: enough images for stable curves in seconds on small data
FIGURE_OPTIONS = DiagnosticsOptions(images=500, train_images=1000, knockout_images=256, pixel_patches=32)


# what the paper's mechanism predicts the decay does to each curve in the deep layers (its "echo" of pixel detail
# through the identity path, weakened); no prediction is drawn where the paper makes none
PREDICTED = {"direct": "decay predicts: lower", "pixels": "decay predicts: lower", "ratio": "decay predicts: lower"}


def _panels(report: dict) -> list[tuple]:
    """(title, x, y, log axis, 95% half-width or None) of each curve one report can draw; depth 0 is the patch
    embedding x_0. The knock-out kNN's band: the binomial interval of a difference of two accuracies on the same
    ``knn_queries`` images, taken as independent (wider than the paired one: read a gap inside it as noise)."""
    out = []
    paths, pixels, branches, knock = (report.get(k) for k in ("paths", "pixels", "branches", "knockout"))
    depth = list(range(len(report["blocks"]) + 1))
    if paths is not None:
        staged = "; each stage from its own input" if "stages" in paths else ""  # None (a gap): a block in no stage
        out.append((f"direct path's share of the stream{staged}\n({PREDICTED['direct']})", depth,
                    [1.0] + _gaps(paths["direct_projection"]), False, None))
        out.append((f"direct path's share of the variance across images{staged}\n({PREDICTED['direct']})", depth,
                    [1.0] + _gaps(paths["direct_projection_centred"]), False, None))
    if pixels is not None:
        out.append((f"pixel R² from the tokens (ridge)\n({PREDICTED['pixels']})", depth, _gaps(pixels["r2_pixels"]),
                    False, None))
        out.append((f"high-frequency pixel R²\n({PREDICTED['pixels']})", depth, _gaps(pixels["r2_high_freq"]), False,
                    None))
    if branches is not None:
        x = [i + (j + 1) / (len(a) + 1) for i, a in enumerate(report["alphas"]) for j in range(len(a))]
        pts = [(xi, r) for xi, r in zip(x, branches["ratio"], strict=True) if r is not None]
        if pts:  # none where every branch is exactly zero (a zero-initialised, untrained model)
            out.append((f"||αx|| / ||f(x)|| per sub-block\n({PREDICTED['ratio']})", [p[0] for p in pts],
                        [p[1] for p in pts], True, None))
        out.append(("cos(αx, f(x)) per sub-block", x, branches["cosine"], False, None))
    if knock is not None and knock["unit"] == "block":
        blocks = list(range(1, len(report["blocks"]) + 1))
        out.append(("knock-out: change of the last layer (pooled, relative)", blocks,
                    [max(v, 1e-6) for v in knock["change_pooled"]], True, None))
        if "knn_top1" in knock:
            p0, n = knock["knn_top1_intact"], knock.get("knn_queries")
            band = None if not n else [1.96 * math.sqrt((p0 * (1 - p0) + p * (1 - p)) / n) for p in knock["knn_top1"]]
            out.append((f"knock-out: kNN top-1 lost (k={knock['knn_k']}; band: 95%, {n} queries)" if n else
                        f"knock-out: kNN top-1 lost (k={knock['knn_k']})", blocks,
                        [p0 - v for v in knock["knn_top1"]], False, band))
    return out


def _gaps(values: list) -> list[float]:
    """A curve with None (a layer the measurement has no value for) drawn as a gap."""
    return [math.nan if v is None else v for v in values]


def plot_diagnostics(reports: dict[str, dict], path: Path, note: str = "") -> Path:
    """One panel per diagnostic, one line per labelled report (``{label: diagnose report}``)."""
    drawn = {label: _panels(r) for label, r in reports.items()}
    titles = list(dict.fromkeys(t for panels in drawn.values() for t, *_ in panels))
    cols = min(4, len(titles))
    rows_n = (len(titles) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.8 * cols, 3.3 * rows_n + 0.8), squeeze=False)
    for ax, title in zip(axes.flat, titles, strict=False):
        for label, panels in drawn.items():
            for t, x, y, log, band in panels:
                if t == title:
                    line, = ax.plot(x, y, "o-", ms=3, label=label)
                    if band is not None:
                        ax.fill_between(x, [v - b for v, b in zip(y, band, strict=True)],
                                        [v + b for v, b in zip(y, band, strict=True)], color=line.get_color(), alpha=0.15)
                    if log:
                        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("depth (0 = patch embedding)" if "knock" not in title else "block removed (1 = first)", fontsize=8)
        ax.grid(alpha=0.3)
    return save_panels(fig, axes, len(titles), path, note)


def eval_note(report: dict) -> str:
    """The caption of ``resdecay eval``'s diagnostics.png: the data, image counts, seed and step it was measured at."""
    d = report["diagnostics"]
    card = d.get("protocol", {})
    step = f"; step {report['step']}" if report.get("step") is not None else ""  # a model trained elsewhere has none
    return (f"{card.get('data', '?')}: {d.get('images', '?')} test images ({d.get('train_images', '?')} train images fit "
            f"the pixel ridge and form the kNN bank), class-balanced, seed {card.get('subset_seed', '?')}{step}; "
            "docs/diagnostics.md")


def summary(report: dict) -> dict:
    """The last block's numbers a table shows: the direct path's share, the pixel / high-frequency R^2, and the
    embedding's R^2 they started from."""
    px, paths = report["pixels"], report["paths"]
    return {"direct_share_last": paths["direct_projection"][-1], "direct_share_centred_last": paths["direct_projection_centred"][-1],
            "pixel_r2_embedding": px["r2_pixels"][0], "pixel_r2_last": px["r2_pixels"][-1],
            "high_freq_r2_embedding": px["r2_high_freq"][0], "high_freq_r2_last": px["r2_high_freq"][-1]}


def diagnose_and_plot(models: dict, data, img_size: int, path: Path, options: DiagnosticsOptions = FIGURE_OPTIONS
                      ) -> tuple[Path, dict]:
    """The diagnostics of each labelled model (``{label: model}``) on the same images, overlaid in one PNG.
    Returns (the PNG, ``{label: {"report": diagnose report, "summary": summary(report)}}``)."""
    out, n = {}, (0, 0)
    for label, model in models.items():
        report, *n = diagnose_data(model, data, img_size, options)
        out[label] = {"report": report, "summary": summary(report)}
    px = next(iter(out.values()))["report"]["pixels"]
    note = (f"{data.name}: {n[0]} test images ({n[1]} train images fit the pixel ridge, {px['patches_per_image']} patches "
            f"each, and form the kNN bank); knock-out on {options.knockout_images}; docs/diagnostics.md")
    return plot_diagnostics({k: v["report"] for k, v in out.items()}, path, note), out
