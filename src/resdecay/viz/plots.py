"""PNG figures: alpha schedules, loss curves and MAE reconstructions (matplotlib, no display)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import torch

from ..data.fashion_mnist_m import composite
from ..eval.metrics import column_metric, column_title
from ..schedule import effective_decay
from .backend import mpimg, plt


def plot_alpha_schedules(schedules: dict[str, torch.Tensor], path: Path, title: str = "") -> Path:
    """Left: alpha per sub-block (attention o, MLP x). Right: the running product, i.e. how much
    of the block-0 input survives the identity path up to each sub-block (log scale)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, a in schedules.items():
        a = torch.as_tensor(a, dtype=torch.float64)
        flat = a.reshape(-1)
        pos = torch.arange(len(flat)) / 2.0  # sub-block k sits at block k/2
        line, = ax1.plot(pos, flat, "-", lw=1, label=f"{label} (alpha_eff {effective_decay(a):.2g})")
        ax1.plot(pos[0::2], flat[0::2], "o", ms=3, color=line.get_color())
        ax1.plot(pos[1::2], flat[1::2], "x", ms=4, color=line.get_color())
        ax2.semilogy(pos, torch.cumprod(flat, 0), "-", color=line.get_color(), label=label)
    ax1.set(xlabel="block (o attention add, x MLP add)", ylabel="alpha (identity weight)", title="shortcut factor per sub-block")
    ax2.axhspan(1e-3, 1e-2, color="green", alpha=0.12, label="paper's alpha_eff range [1e-3, 1e-2)")
    ax2.set(xlabel="block", ylabel="cumulative product of alpha", title="identity signal left (alpha_eff at the end)")
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_loss_curves(runs: dict[str, list[dict]], path: Path, title: str = "training loss") -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, rows in runs.items():
        if rows:
            ax.plot([r["epoch"] for r in rows], [r["loss"] for r in rows], label=label)
    ax.set(xlabel="epoch", ylabel="loss (norm-pix MSE on masked patches)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


@torch.no_grad()
def reconstruct(model, images: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked reconstruction in pixel space: visible patches from the input, removed ones from
    the model. With norm-pix targets the predictions are un-normalised with the mean and
    variance of the *visible* patches of the same image (the true statistics of a removed patch
    are unknown to the model). The same seed gives the same mask for every model of a size.

    Returns (masked input with removed patches at 0.5 grey in data space, reconstruction)."""
    model.eval()
    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(seed)
        _, pred, mask = model(images)
    target = model.patchify(images)  # (B, N, P)
    if model.cfg.norm_pix_loss:
        keep = (1 - mask).unsqueeze(-1)  # (B, N, 1)
        n = keep.sum(1, keepdim=True).clamp_min(1)
        mean = (target * keep).sum((1, 2), keepdim=True) / (n * target.shape[-1])
        var = ((target - mean) ** 2 * keep).sum((1, 2), keepdim=True) / (n * target.shape[-1])
        pred = pred * (var + 1e-6).sqrt() + mean
    m = mask.unsqueeze(-1)
    recon = model.unpatchify(target * (1 - m) + pred * m)
    masked = model.unpatchify(target * (1 - m) + target.mean() * m)
    return masked, recon


def plot_reconstructions(images: torch.Tensor, rows: dict[str, torch.Tensor], mean, std, path: Path,
                         note: str = "") -> Path:
    """Grid: one row per entry of ``rows`` (e.g. original / masked / plain / decayed), images
    de-normalised with the dataset's mean and std."""
    mean = torch.tensor(mean).view(1, -1, 1, 1)
    std = torch.tensor(std).view(1, -1, 1, 1)
    n = images.shape[0]
    fig, axes = plt.subplots(len(rows), n, figsize=(1.1 * n + 1.6, 1.2 * len(rows) + 0.6), squeeze=False)
    for r, (label, batch) in enumerate(rows.items()):
        pix = (batch.cpu() * std + mean).clamp(0, 1)
        for c in range(n):
            ax = axes[r][c]
            img = pix[c].permute(1, 2, 0).numpy()
            ax.imshow(img.squeeze(-1) if img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if c == 0:
                ax.set_ylabel(label, fontsize=8, rotation=0, ha="right", va="center")
    if note:
        fig.text(0.5, 0.01, note, ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.05 if note else 0, 1, 1))
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def profile_panels(profiles: dict[str, list[dict]]) -> list[tuple[str, str, bool]]:
    """(column, title, log axis) of every numeric column the profiles hold, in row order; titles and
    axes come from the metric registry, so a plugin's metric gets a panel too."""
    keys = dict.fromkeys(k for rows in profiles.values() for r in rows for k, v in r.items()
                         if k != "layer" and isinstance(v, (int, float)))
    panels = []
    for key in keys:
        metric = column_metric(key)
        panels.append((key, column_title(key), metric is not None and metric.display.log_scale))
    return panels


def plot_profile(profiles: dict[str, list[dict]], path: Path, note: str = "") -> Path:
    """Per-layer abstraction profile, one panel per measurement, one line per checkpoint."""
    panels = profile_panels(profiles)
    cols = min(4, len(panels))
    rows_n = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.6 * cols, 3.0 * rows_n + 0.5), squeeze=False)
    for ax, (key, title, log) in zip(axes.flat, panels, strict=False):
        for label, rows in profiles.items():
            pts = [(r["layer"], r[key]) for r in rows if key in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), "o-", ms=3, label=label)
        if log:
            ax.set_yscale("log")
        ax.set(title=title, xlabel="encoder block")
        ax.grid(alpha=0.3)
    return save_panels(fig, axes, len(panels), path, note)


def save_panels(fig, axes, used: int, path: Path, note: str = "") -> Path:
    """A grid of panels finished and saved: the unused axes hidden, block indices as integers, titles wrapped so that
    neighbours never overlap, one legend under the grid (off the curves), ``note`` under it."""
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415  (matplotlib loads with the first figure, not the CLI)

    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    for ax in list(axes.flat)[:used]:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        lines = [w for part in ax.get_title().split("\n") for w in textwrap.wrap(part, 38, break_long_words=False)]
        ax.set_title("\n".join(lines), fontsize=9)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    bottom = 0.0
    if labels:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=7, frameon=False,
                   bbox_to_anchor=(0.5, 0.025 if note else 0.0))
        bottom = 0.05 + 0.025 * ((len(labels) - 1) // 3)
    if note:
        fig.text(0.5, 0.005, note, ha="center", fontsize=7)
        bottom += 0.03
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return _save(fig, path)


def plot_bars(groups: dict[str, dict[str, float]], path: Path, title: str = "",
              errors: dict[str, dict[str, float | None]] | None = None) -> Path:
    """Grouped bars: one group per measurement, one bar per run; ``errors`` (same keys, e.g. the
    standard deviation over seeds) draws error bars where given."""
    names = list(groups)
    runs = list(dict.fromkeys(r for g in groups.values() for r in g))
    width = 0.8 / max(1, len(runs))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(names) * max(1, len(runs)) * 0.6 + 2), 4))
    for i, run in enumerate(runs):
        xs = [j + i * width for j, n in enumerate(names) if run in groups[n]]
        ys = [groups[n][run] for n in names if run in groups[n]]
        err = [((errors or {}).get(n, {}).get(run) or 0.0) for n in names if run in groups[n]] if errors else None
        ax.bar(xs, ys, width, label=run, yerr=err, capsize=3 if errors else 0)
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(names))])
    ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_rank_vs_depth(rows: dict[str, dict], path: Path, title: str = "") -> Path:
    """Figure 7: effective rank of the final features against network depth, one line per
    alpha_min (rows carry "depth", "alpha_min" and measures["rank_cls"])."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for a in sorted({r["alpha_min"] for r in rows.values()}, reverse=True):
        pts = sorted((r["depth"], r["measures"]["rank_cls"]) for r in rows.values()
                     if r["alpha_min"] == a and "rank_cls" in r["measures"])
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", label=f"alpha_min {a:g}")
    ax.set(xlabel="residual blocks", ylabel="effective rank (paper eq. 6, pooled test features)", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, path)


def plot_grid(result: dict, path: Path, title: str) -> None:
    """Heat map of a diffusion probe grid (block x noise level), best cell in the title."""
    grid = torch.tensor(result["top1"])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * grid.shape[1], 1.0 + 0.4 * grid.shape[0]))
    im = ax.imshow(grid.numpy(), aspect="auto", cmap="viridis", origin="lower")
    for (i, j), v in zip(((i, j) for i in range(grid.shape[0]) for j in range(grid.shape[1])), grid.flatten().tolist(), strict=True):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < grid.mean() else "black")
    ax.set_xticks(range(grid.shape[1]), [f"{lv:g}" for lv in result["levels"]])
    ax.set_yticks(range(grid.shape[0]), [str(l) for l in result["layers"]])
    ax.set_xlabel("noise level (0 = clean, 1 = pure noise)")
    ax.set_ylabel("block")
    b = result["best"]
    ax.set_title(f"{title}\nbest: block {b['layer']}, noise {b['level']:g}, top-1 {b['top1']:.3f}", fontsize=9)
    fig.colorbar(im, ax=ax, label="linear probe top-1 (fast recipe)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def plot_sample_grids(results: dict, path: Path, title: str) -> Path:
    """The sample PNGs of several runs side by side, each titled with its FID."""

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 5.4))
    for ax, (label, r) in zip(axes, results.items(), strict=True):
        ax.imshow(mpimg.imread(r["samples"]["png"]), cmap="gray")
        ax.set_title(f"{label}\n{r['fid']['label']} {r['fid']['value']:.2f}", fontsize=9)
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))  # leave the top strip to the suptitle
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_nuisance_samples(garments: torch.Tensor, labels: list[str], configs: dict[str, tuple], path: Path,
                          canvas: int = 32, seed: int = 0, title: str = "", compositions: dict | None = None) -> Path:
    """Fashion-MNIST-M: one row per nuisance setting, the same garments (columns) in every row,
    so each row shows what one knob adds. ``configs`` maps a row title to the nuisances that are on,
    ``compositions`` a row title to its generator ("photos" where not named)."""
    rows = {name: composite(garments, "train", canvas, on, seed, composition=(compositions or {}).get(name, "photos"))
            for name, on in configs.items()}
    fig, axes = plt.subplots(len(rows), len(garments), figsize=(1.1 * len(garments) + 1.6, 1.15 * len(rows)), squeeze=False)
    for r, (name, imgs) in enumerate(rows.items()):
        for c in range(len(garments)):
            ax = axes[r, c]
            ax.imshow(imgs[c].permute(1, 2, 0).numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(labels[c], fontsize=8)
        axes[r, 0].set_ylabel(name, fontsize=8, rotation=0, ha="right", va="center")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)
