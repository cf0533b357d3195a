"""Paper figures as PNGs: feature t-SNE and PCA patch maps from models, and rank / accuracy
curves from logged online-evaluation rows (``<run>/log.jsonl``, see ``resdecay.train.log.runlog.read_log``).

Every figure states its protocol on the figure itself (layer, pooling, recipe, fitting set), and
every function returns a protocol card (a JSON-able dict), because numbers from two figures are
comparable only when they were measured the same way.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Subset

from ..eval.features.extract import extract_block_features
from ..eval.metrics import DIFFUSION, SAMPLES, column_metric, column_title, registered
from .backend import plt
from .plots import _save

KNN_KEY = "online_knn_top1"  # the accuracy a run without the online probe falls back to


def diffusion_keys() -> tuple[str, ...]:
    """The diffusion families' online curves, one per registered samples / diffusion metric (proxy FID,
    best probe cell), read when asked: a plugin registers after this module is imported."""
    return tuple(f"online_{m.display.key}" for kind in (SAMPLES, DIFFUSION) for m in registered(kind, "online"))


POOL_WORDS = {"mean": "mean of cls+patch tokens", "cls": "cls token", "patch_mean": "mean of patch tokens"}


def _label(key: str) -> str:
    """Axis label of a logged key: its metric's title in the registry (the online protocol's wording)."""
    return column_title(key)


def _device(model: torch.nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _layer_words(model: torch.nn.Module, layer: int) -> tuple[int, str]:
    """Resolve a (possibly negative) block index to 0-indexed block i and a title phrase."""
    depth = len(model.blocks)
    i = layer % depth
    return i, f"block {i} of 0..{depth - 1}" + (" (last)" if i == depth - 1 else "")


# ----------------------------------------------------------------------------- t-SNE (v1 Fig. 3)
def _dataset_labels(dataset) -> list[int]:
    """Labels without decoding images where the dataset keeps them (TensorImages, ImageFolder)."""
    for attr in ("labels", "targets"):
        if hasattr(dataset, attr):
            vals = getattr(dataset, attr)
            return [int(y) for y in (vals.tolist() if hasattr(vals, "tolist") else vals)]
    if isinstance(dataset, Subset):
        inner = _dataset_labels(dataset.dataset)
        return [inner[i] for i in dataset.indices]
    return [int(dataset[i][1]) for i in range(len(dataset))]


def balanced_indices(labels: list[int], classes: int, per_class: int) -> list[int]:
    """Dataset indices of the first ``per_class`` images (in dataset order) of each of the
    ``classes`` smallest label values: a fixed, balanced subset, the same for every model."""
    wanted = sorted(set(labels))[:classes]
    if len(wanted) < classes:
        raise ValueError(f"the dataset has {len(wanted)} classes, fewer than the {classes} asked for")
    taken: dict[int, list[int]] = {c: [] for c in wanted}
    for i, y in enumerate(labels):
        if y in taken and len(taken[y]) < per_class:
            taken[y].append(i)
    short = {c: len(v) for c, v in taken.items() if len(v) < per_class}
    if short:
        raise ValueError(f"classes {short} (class: images) have fewer than per_class={per_class} images; lower per_class")
    return sorted(i for v in taken.values() for i in v)


def plot_tsne(models: dict[str, torch.nn.Module], dataset, path: Path, classes: int = 10, per_class: int = 100,
              layer: int = -1, pool: str = "mean", seed: int = 0, class_names: list[str] | None = None) -> dict:
    """t-SNE of frozen features, one panel per model (the earlier paper version's Figure 3).

    Protocol: the first ``per_class`` images of each of the first ``classes`` classes (dataset
    order, no augmentation), the same images for every model; features are the output of encoder
    block ``layer`` pooled with ``pool`` (see ``eval.features.pool_tokens``), unnormalised;
    sklearn TSNE with 2 components, PCA initialisation, perplexity min(30, (n-1)/3) and
    ``random_state=seed``. Points are coloured by class. t-SNE keeps neighbourhoods, not
    distances: read the panels for class separation, not for cluster sizes or gaps.
    """
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    idx = balanced_indices(_dataset_labels(dataset), classes, per_class)
    subset = Subset(dataset, idx)
    n = len(idx)
    perplexity = float(min(30.0, (n - 1) / 3))  # TSNE requires perplexity < n
    names = class_names or getattr(dataset, "classes", None)
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models) + 1.6, 4.6), squeeze=False)
    points, layers, counts = {}, {}, {}
    for ax, (label, model) in zip(axes[0], models.items(), strict=True):
        feats, y = extract_block_features(model, subset, layers=[layer], pools=(pool,), device=_device(model),
                                          progress=False, desc=f"t-SNE {label}")
        x = feats[(layer, pool)].double().numpy()
        # One OpenMP thread: Barnes-Hut t-SNE on ~1000 points takes seconds on one core, while its
        # spin-waiting threads next to torch's own OpenMP pool ran 3-6x slower on a busy 2-core box.
        with threadpool_limits(1, user_api="openmp"):
            emb = TSNE(n_components=2, init="pca", perplexity=perplexity, random_state=seed).fit_transform(x)
        y = y.numpy()
        points[label] = int(emb.shape[0])
        layers[label], words = _layer_words(model, layer)
        counts = {int(c): int((y == c).sum()) for c in np.unique(y)}
        cmap = plt.get_cmap("tab10" if classes <= 10 else "tab20")
        for k, c in enumerate(np.unique(y)):
            sel = y == c
            ax.scatter(emb[sel, 0], emb[sel, 1], s=6, color=cmap(k % cmap.N),
                       label=str(names[c]) if names is not None else str(c))
        ax.set_title(f"{label}\n{words}, {POOL_WORDS.get(pool, pool)}", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    # One legend for all panels (the classes are the same), outside so it hides no points.
    handles, texts = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, texts, loc="center right", fontsize=8, markerscale=2.5, title="class")
    fig.text(0.01, 0.01, f"t-SNE (PCA init, perplexity {perplexity:.3g}, seed {seed}) of {n} images: "
             f"first {per_class} of each of {classes} classes", fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1 - 1.3 / fig.get_figwidth(), 1))
    _save(fig, path)
    return {"figure": "t-SNE", "layer": layer, "layer_index": layers, "pool": pool, "images": n,
            "per_class": per_class, "classes": classes, "class_counts": counts, "points": points,
            "seed": seed, "perplexity": perplexity, "path": str(path)}


# ----------------------------------------------------------------------------- PCA maps (Fig. 3)
def pca_rgb_maps(tokens: torch.Tensor, grid: int, seed: int = 0, clip: tuple[float, float] = (1.0, 99.0)):
    """Patch tokens (B, N, D) with N = grid*grid in row-major order -> (maps (B, grid, grid, 3)
    in [0, 1], explained variance ratios (3,)).

    One 3-component PCA is fitted over all B*N tokens, so colours mean the same thing in every
    image; each component is min-max scaled over the whole set after clipping at the given
    percentiles, so a few extreme tokens cannot wash the maps out."""
    from sklearn.decomposition import PCA

    if tokens.ndim == 2:
        tokens = tokens.unsqueeze(0)
    B, N, D = tokens.shape
    if N != grid * grid:
        raise ValueError(f"{N} patch tokens do not form a {grid}x{grid} grid (drop the cls token first)")
    x = tokens.reshape(B * N, D).double().cpu().numpy()
    if min(B * N, D) < 3:
        raise ValueError(f"a 3-component PCA needs at least 3 tokens of width >= 3, got {B * N} of width {D}")
    pca = PCA(n_components=3, random_state=seed)
    z = pca.fit_transform(x)  # (B*N, 3)
    lo, hi = np.percentile(z, clip[0], axis=0), np.percentile(z, clip[1], axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)  # a constant component maps to 0, not NaN
    z = np.clip((z - lo) / span, 0.0, 1.0)
    return z.reshape(B, grid, grid, 3), pca.explained_variance_ratio_.copy()


@torch.no_grad()
def plot_pca_maps(models: dict[str, torch.nn.Module], images: torch.Tensor, mean, std, path: Path,
                  layer: int = -1, seed: int = 0) -> dict:
    """PCA maps of patch tokens (the paper's Figure 3).

    Protocol: for each model, the patch tokens (cls dropped) of encoder block ``layer`` for all
    given images (unmasked, eval mode) are pooled into one set; a 3-component PCA is fitted on
    that set per model, and the three leading components, clipped at the 1st/99th percentile and
    min-max scaled over the set, are shown as R, G, B on each image's patch grid. First row: the
    images (de-normalised with ``mean``/``std``); then one row per model. Coherent object-shaped
    colour regions mean the tokens encode parts/semantics; colours are comparable within a row
    only (each model has its own PCA).
    """
    images = images.float()
    mean_t, std_t = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    pix = (images.cpu() * std_t + mean_t).clamp(0, 1)
    n = images.shape[0]
    rows = 1 + len(models)
    fig, axes = plt.subplots(rows, n, figsize=(1.15 * n + 1.9, 1.2 * rows + 0.5), squeeze=False)
    for c in range(n):
        img = pix[c].permute(1, 2, 0).numpy()
        axes[0][c].imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray", vmin=0, vmax=1)
    axes[0][0].set_ylabel("image", fontsize=8, rotation=0, ha="right", va="center")
    explained, layers = {}, {}
    for r, (label, model) in enumerate(models.items(), start=1):
        was_training = model.training
        model.eval()
        tokens = model.forward_intermediates(images.to(_device(model)), [layer])[0][:, 1:].float().cpu()
        model.train(was_training)
        maps, ev = pca_rgb_maps(tokens, model.patch_embed.grid, seed=seed)
        explained[label] = [float(v) for v in ev]
        layers[label] = _layer_words(model, layer)[0]
        for c in range(n):
            axes[r][c].imshow(maps[c], interpolation="nearest")
        ev_txt = "/".join(f"{v:.2f}" for v in ev)
        axes[r][0].set_ylabel(f"{label}\nEV {ev_txt}", fontsize=8, rotation=0, ha="right", va="center")
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    layer_txt = ", ".join(f"{i}" for i in sorted(set(layers.values())))
    fig.text(0.5, 0.01, f"PCA of layer {layer_txt} patch tokens (0-indexed block), 3 leading components as RGB, "
             f"fitted per model over these {n} images; EV = explained variance ratios", ha="center", fontsize=7)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    _save(fig, path)
    return {"figure": "PCA maps", "layer": layer, "layer_index": layers, "images": n,
            "tokens_per_model": n * next(iter(models.values())).patch_embed.num_patches if models else 0,
            "components": 3, "clip_percentiles": [1, 99], "fit": "per model, over all patch tokens of these images",
            "seed": seed, "explained_variance_ratio": explained, "path": str(path)}


# ----------------------------------------------------------------------------- logged curves (Fig. 4, 5c)
def online_rows(rows: list[dict]) -> list[dict]:
    """Rows written by online evaluation (any ``online_*`` key), sorted by step, one per step: a
    resumed run may log a step twice, and the later row (the one after the resume) wins. Rows
    without a step are dropped."""
    by_step: dict = {}
    for row in rows:
        if row.get("step") is not None and any(k.startswith("online_") for k in row):
            by_step[row["step"]] = row
    return [by_step[s] for s in sorted(by_step)]


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(epochs, values) of the online rows that logged a finite ``key``; x is the step when a
    row has no epoch."""
    pts = [(r.get("epoch", r["step"]), r[key]) for r in online_rows(rows) if _finite(r.get(key))]
    return [p[0] for p in pts], [p[1] for p in pts]


def _accuracy_key(rows: list[dict], key: str) -> str:
    """``key`` if the run logged it, else the kNN accuracy (runs without the online probe)."""
    return key if _series(rows, key)[1] or not _series(rows, KNN_KEY)[1] else KNN_KEY


def rank_accuracy_correlation(rows: list[dict], accuracy_key: str = "online_probe_top1",
                              rank_key: str = "online_rank_cls") -> dict:
    """Pearson correlation between effective rank and accuracy over the epochs of one run
    (online rows logging both finite values): {"pearson_r", "p_value" (None without scipy), "n"}."""
    pts = [(r[rank_key], r[accuracy_key]) for r in online_rows(rows)
           if _finite(r.get(rank_key)) and _finite(r.get(accuracy_key))]
    if len(pts) < 3:
        raise ValueError(f"a correlation needs at least 3 evaluations logging both {rank_key} and "
                         f"{accuracy_key}; this run has {len(pts)}")
    rank, acc = np.array(pts, dtype=np.float64).T
    if rank.std() == 0 or acc.std() == 0:
        raise ValueError(f"{rank_key if rank.std() == 0 else accuracy_key} is constant over the {len(pts)} "
                         f"evaluations, so the correlation is undefined")
    try:
        from scipy.stats import pearsonr
    except ImportError:
        return {"pearson_r": float(np.corrcoef(rank, acc)[0, 1]), "p_value": None, "n": len(pts)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # n = 3 gives a p-value with 1 degree of freedom; fine, it is reported
        res = pearsonr(rank, acc)
    return {"pearson_r": float(res.statistic), "p_value": float(res.pvalue), "n": len(pts)}


def _fallback_note(fig, accuracy_key: str, used: dict[str, str]) -> bool:
    """Footnote for runs whose accuracy is the kNN fallback (kept off the axis label, which a
    second line would push out of the figure). Returns whether one was written."""
    if all(k == accuracy_key for k in used.values()):
        return False
    fig.text(0.01, 0.01, f"[kNN]: the run logged no {accuracy_key}; its accuracy is {_label(KNN_KEY)} "
             f"on frozen features", fontsize=7)
    return True


def plot_rank_and_accuracy(runs: dict[str, list[dict]], path: Path, accuracy_key: str = "online_probe_top1",
                           rank_key: str = "online_rank_cls") -> dict:
    """Effective rank (left) and accuracy (right) against training epoch, one line per run (the
    paper's Figure 4), from the online-evaluation rows of each run's log. Runs that logged no
    ``accuracy_key`` fall back to the online kNN accuracy and are marked [kNN] in the legend."""
    used = {label: _accuracy_key(rows, accuracy_key) for label, rows in runs.items()}
    points = {label: len(_series(rows, rank_key)[1]) + len(_series(rows, used[label])[1]) for label, rows in runs.items()}
    if not any(points.values()):
        raise ValueError(f"no run logged {rank_key} or {accuracy_key}/{KNN_KEY}; enable online evaluation in training")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, rows in runs.items():
        line, = ax1.plot(*_series(rows, rank_key), "o-", ms=3, label=label if points[label] else f"{label} (no online rows)")
        mark = " [kNN]" if used[label] != accuracy_key else ""
        ax2.plot(*_series(rows, used[label]), "o-", ms=3, color=line.get_color(), label=label + mark)
    ax1.set(xlabel="epoch", ylabel=_label(rank_key), title="effective rank during training")
    ax2.set(xlabel="epoch", ylabel=_label(accuracy_key), title="accuracy during training")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04 if _fallback_note(fig, accuracy_key, used) else 0, 1, 1))
    _save(fig, path)
    return {"figure": "rank and accuracy vs epoch", "rank_key": rank_key, "accuracy_key": accuracy_key,
            "accuracy_key_per_run": used, "points": points, "path": str(path)}


def plot_correlation(runs: dict[str, list[dict]], path: Path, accuracy_key: str = "online_probe_top1",
                     rank_key: str = "online_rank_cls") -> dict:
    """Accuracy against effective rank, one point per online evaluation, one colour per run,
    legend with each run's Pearson r over its epochs (the paper's Figure 5c). Returns
    {label: {"pearson_r", "p_value", "n", "accuracy_key"}}; r and p are None (with a "note")
    for a run with fewer than 3 points or a constant series."""
    out: dict = {}
    fig, ax = plt.subplots(figsize=(6.5, 4.6))
    used = {label: _accuracy_key(rows, accuracy_key) for label, rows in runs.items()}
    for label, rows in runs.items():
        pts = [(r[rank_key], r[used[label]]) for r in online_rows(rows)
               if _finite(r.get(rank_key)) and _finite(r.get(used[label]))]
        try:
            stats = rank_accuracy_correlation(rows, used[label], rank_key)
            legend = f"{label}: r = {stats['pearson_r']:.2f} (n={stats['n']})"
        except ValueError as e:
            stats = {"pearson_r": None, "p_value": None, "n": len(pts), "note": str(e)}
            legend = f"{label}: r n/a (n={len(pts)})"
        out[label] = {**stats, "accuracy_key": used[label]}
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=18, label=legend + (" [kNN]" if used[label] != accuracy_key else ""))
    ax.set(xlabel=_label(rank_key), ylabel=_label(accuracy_key),
           title="accuracy vs effective rank across epochs (Pearson r per run)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.04 if _fallback_note(fig, accuracy_key, used) else 0, 1, 1))
    _save(fig, path)
    return out


def plot_diffusion_curves(runs: dict[str, list[dict]], path: Path) -> dict:
    """Diffusion runs (train.online_eval_every on a U-ViT / SiT): proxy FID of freshly drawn samples
    (left) and the best cell of the probe grid (right) against the epoch, one line per run: Table 4's
    two columns followed through training. The protocol (sampler, extractor, probe sets) is the
    run's logged ``online_protocol``."""
    keys = diffusion_keys()
    points = {label: len(_series(rows, keys[0])[1]) for label, rows in runs.items()}
    if not any(points.values()):
        raise ValueError(f"no run logged {keys[0]}; train the diffusion model with train.online_eval_every=N")
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), squeeze=False)
    axes = axes[0]
    protocol = next((r["online_protocol"] for rows in runs.values() for r in online_rows(rows) if "online_protocol" in r), {})
    for label, rows in runs.items():
        line, = axes[0].plot(*_series(rows, keys[0]), "o-", ms=3, label=label)
        for ax, key in zip(axes[1:], keys[1:], strict=True):
            ax.plot(*_series(rows, key), "o-", ms=3, color=line.get_color(), label=label)
    for ax, key in zip(axes, keys, strict=True):
        metric = column_metric(key)
        ax.set(xlabel="epoch", ylabel=_label(key), title=f"{metric.display.label if metric else key} during training")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    note = f"{protocol.get('samples', '')}; sampler {protocol.get('sampler', '?')} ({protocol.get('steps', '?')} steps)"
    fig.text(0.01, 0.01, note, fontsize=7)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _save(fig, path)
    return {"figure": "proxy FID and best probe cell vs epoch", "keys": list(keys), "points": points,
            "protocol": protocol, "path": str(path)}
