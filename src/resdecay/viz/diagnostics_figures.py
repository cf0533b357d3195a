"""The residual-stream diagnostics as one PNG of per-layer curves, one line per model (plain vs decayed
overlaid): the direct path's share of the stream, the pixel and high-frequency R^2 of each layer's tokens,
shortcut / branch per sub-block, and the knock-out. Reads ``diagnose``'s report (``eval.json["diagnostics"]``)."""

from __future__ import annotations

from pathlib import Path

from ..eval.diagnostics.source import DiagnosticsOptions, diagnose_data
from .backend import plt
from .plots import save_panels

# what the demo and ``resdecay figures`` measure: enough images for stable curves in seconds on small data
FIGURE_OPTIONS = DiagnosticsOptions(images=500, train_images=1000, knockout_images=256, pixel_patches=32)


def _panels(report: dict) -> list[tuple[str, list, list, bool]]:
    """(title, x, y, log axis) of each curve one report can draw; depth 0 is the patch embedding x_0."""
    out = []
    paths, pixels, branches, knock = (report.get(k) for k in ("paths", "pixels", "branches", "knockout"))
    depth = list(range(len(report["blocks"]) + 1))
    if paths is not None:
        out.append(("direct path's share of the stream", depth, [1.0] + paths["direct_projection"], False))
        out.append(("direct path's share of the variance\nacross images", depth,
                    [1.0] + paths["direct_projection_centred"], False))
    if pixels is not None:
        out.append(("pixel R² from the tokens (ridge)", depth, pixels["r2_pixels"], False))
        out.append(("high-frequency pixel R²", depth, pixels["r2_high_freq"], False))
    if branches is not None:
        x = [i + (j + 1) / (len(a) + 1) for i, a in enumerate(report["alphas"]) for j in range(len(a))]
        pts = [(xi, r) for xi, r in zip(x, branches["ratio"], strict=True) if r is not None]
        out.append(("||αx|| / ||f(x)|| per sub-block", [p[0] for p in pts], [p[1] for p in pts], True))
        out.append(("cos(αx, f(x)) per sub-block", x, branches["cosine"], False))
    if knock is not None and knock["unit"] == "block":
        blocks = list(range(1, len(report["blocks"]) + 1))
        out.append(("knock-out: change of the last layer\n(pooled, relative)", blocks,
                    [max(v, 1e-6) for v in knock["change_pooled"]], True))
        if "knn_top1" in knock:
            out.append((f"knock-out: kNN top-1 lost (k={knock['knn_k']})", blocks,
                        [knock["knn_top1_intact"] - v for v in knock["knn_top1"]], False))
    return out


def plot_diagnostics(reports: dict[str, dict], path: Path, note: str = "") -> Path:
    """One panel per diagnostic, one line per labelled report (``{label: diagnose report}``)."""
    drawn = {label: _panels(r) for label, r in reports.items()}
    titles = list(dict.fromkeys(t for panels in drawn.values() for t, *_ in panels))
    cols = min(4, len(titles))
    rows_n = (len(titles) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.8 * cols, 3.1 * rows_n + 0.6), squeeze=False)
    for ax, title in zip(axes.flat, titles, strict=False):
        for label, panels in drawn.items():
            for t, x, y, log in panels:
                if t == title:
                    ax.plot(x, y, "o-", ms=3, label=label)
                    if log:
                        ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("depth (0 = patch embedding)" if "knock" not in title else "block removed (1 = first)", fontsize=8)
        ax.grid(alpha=0.3)
    return save_panels(fig, axes, len(titles), path, note)


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
