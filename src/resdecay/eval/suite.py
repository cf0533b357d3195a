"""``resdecay eval``: frozen features extracted once per (checkpoint, data, protocol) and cached
on disk, then kNN, linear probe and effective rank, every number carrying its protocol card.

With ``layer="all"`` it is the per-layer abstraction profile: for every encoder block kNN, a
fast linear probe, effective rank, the mean token norm and the shortcut-to-branch norm ratio
||alpha*x|| / ||f(x)|| of both sub-blocks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..data import DataConfig, build_dataset, check_first_sample
from ..errors import UserError, one_line
from ..io import atomic_save, file_sha256, run_dir_of, safe_load, sweep_stale_temps
from ..nn.blocks import block_statistics as record_block_statistics
from ..nn.decayify import alphas_of
from ..train.checkpoint import load_checkpoint, load_model
from ..train.config import shortcut_tag
from ..train.distributed import resolve_device
from . import baselines as bl
from .features import POOLINGS, extract_features
from .knn import knn_topk
from .probe import FAST_RECIPE, IN100_RECIPE, linear_probe
from .rank import effective_rank

EVALS = ("knn", "probe", "rank")
FEATURE_FORMAT = 1  # bump when extraction changes, so old caches are not reused
STATS_IMAGES = 512  # test images used for the norm statistics of the profile


@dataclass
class EvalSettings:
    evals: tuple[str, ...] = EVALS
    layer: int | str = -1  # encoder block index, or "all" for the per-layer profile
    feature: str = "mean"  # pooling for kNN and probe: mean (all tokens incl. cls) | cls | patch_mean
    knn_k: int = 20
    knn_temperature: float = 0.07
    probe_epochs: int | None = None  # None: 200 (IN-100 recipe) for one layer, 30 (fast) for the profile
    probe_norm: str | None = None  # None: the recipe's (none for IN-100, batchnorm for fast) | none | batchnorm
    rank_exp: bool = False  # False: paper eq. 6 (entropy); True: exp of it (Roy & Vetterli)
    data: DataConfig | None = None  # None: the checkpoint's training data, without augmentation
    max_train: int | None = None  # first N training images as the kNN bank / probe training set
    max_test: int | None = None
    batch_size: int = 256
    num_workers: int = 0
    device: str = "auto"
    cache_dir: str | None = None  # default: <run>/eval/cache
    progress: bool = True
    baselines: bool = True  # also measure raw pixels and the run's randomly initialised encoder (eval/baselines.py)
    data_path: str | None = None  # with data=None: the checkpoint's data set, read from this folder

    def validate(self) -> None:
        bad = [e for e in self.evals if e not in EVALS]
        if bad or not self.evals:
            raise UserError(f"unknown evaluation {bad[0] if bad else '(none)'!r}; choose from {', '.join(EVALS)}")
        if self.feature not in POOLINGS:
            raise UserError(f"--feature {self.feature!r} is unknown; choose one of {', '.join(POOLINGS)}")
        if self.knn_k < 1:
            raise UserError(f"--k must be a positive integer, got {self.knn_k}")
        if self.probe_norm not in (None, "none", "batchnorm"):
            raise UserError(f"--probe-norm {self.probe_norm!r} is unknown; choose none or batchnorm")
        for name in ("max_train", "max_test", "probe_epochs"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")


def _data_card(data: DataConfig, split: str, n: int, img_size: int) -> dict:
    path = str(Path(data.path).resolve()) if data.path else None
    return {"data": data.name, "data_path": path, "split": split, "images": n, "img_size": img_size,
            "augmentation": "none", "resize": data.resize}


def cached_features(model, ckpt_sha: str, data: DataConfig, split: str, img_size: int, layers: list[int],
                    pools: tuple[str, ...], limit: int | None, s: EvalSettings, cache_dir: Path, device) -> tuple:
    """Features of one split, from the cache when the same checkpoint, data and protocol were
    extracted before. Returns (feats, labels, data card, cache hit)."""
    dataset, _ = build_dataset(data, split, img_size, augment=False)
    check_first_sample(dataset, model.cfg.in_chans, img_size, data.name)
    if limit:
        dataset = torch.utils.data.Subset(dataset, range(min(limit, len(dataset))))
    card = _data_card(data, split, len(dataset), img_size)
    key = {"format": FEATURE_FORMAT, "checkpoint_sha256": ckpt_sha, **card, "layers": layers, "pools": sorted(pools)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    file = cache_dir / f"{split}-{digest}.pt"
    sweep_stale_temps(cache_dir)  # left by an eval killed while writing
    cached = load_cached(file, [(l, p) for l in layers for p in pools], len(dataset))
    if cached is not None:
        return *cached, card, True
    feats, labels = extract_features(model, dataset, layers, tuple(sorted(pools)), s.batch_size, device,
                                     s.num_workers, s.progress, desc=f"features ({split})")
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        cache_dir.mkdir(parents=True, exist_ok=True)
        atomic_save({"feats": {f"{l}:{p}": v for (l, p), v in feats.items()}, "labels": labels, "key": json.dumps(key)}, file)
    return feats, labels, card, False


def load_cached(file: Path, wanted: list[tuple], n: int) -> tuple | None:
    """(feats, labels) from a cache file, or None when there is none. A damaged file (truncated,
    empty, not a cache, wrong shapes) is reported in one line, deleted and recomputed."""
    if not file.exists():
        return None
    try:
        blob = safe_load(file, UserError, "{reason}")
        feats = {(int(k.split(":")[0]), k.split(":")[1]): v for k, v in blob["feats"].items()}
        labels = blob["labels"]
        if not (isinstance(labels, torch.Tensor) and len(labels) == n
                and all(isinstance(feats.get(k), torch.Tensor) and len(feats[k]) == n for k in wanted)):
            raise ValueError(f"it does not hold features of the {n} images")
    except (UserError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        print(f"resdecay: warning: feature cache {file} is damaged ({one_line(e)}); recomputing it", file=sys.stderr)
        file.unlink(missing_ok=True)
        return None
    return feats, labels


@torch.no_grad()
def block_statistics(model, dataset, n: int, device) -> list[dict]:
    """Per-block mean token norms on the first ``n`` images: output norm and the shortcut-to-
    branch ratio ||alpha*x|| / ||f(x)|| of the attention and MLP sub-blocks."""
    images = torch.stack([dataset[i][0] for i in range(min(n, len(dataset)))]).to(device)
    with record_block_statistics(model.blocks) as stats:
        model.forward_intermediates(images, [len(model.blocks) - 1])
    return [{"feature_norm": st["output"],
             "shortcut_ratio_attn": st["shortcut_attn"] / max(st["branch_attn"], 1e-12),
             "shortcut_ratio_mlp": st["shortcut_mlp"] / max(st["branch_mlp"], 1e-12)} for st in stats]


def evaluate_checkpoint(checkpoint: str | Path, s: EvalSettings) -> dict | None:
    """Evaluate one checkpoint; returns the report (None on non-zero torchrun ranks)."""
    s.validate()
    checkpoint = Path(checkpoint)
    device = resolve_device(s.device, "--device")
    state = load_checkpoint(checkpoint)
    model, cfg = load_model(checkpoint, device, state=state)
    depth = len(model.blocks)
    if s.layer == "all":
        layers = list(range(depth))
    else:
        if not -depth <= int(s.layer) < depth:
            raise UserError(f"--layer {s.layer} is out of range: the encoder has {depth} blocks (0..{depth - 1}, or -1 for the last)")
        layers = [int(s.layer) % depth]
    data = s.data or replace(cfg.data, augment="none", train_subset=None, path=s.data_path or cfg.data.path)
    sha = file_sha256(checkpoint)
    cache_dir = Path(s.cache_dir) if s.cache_dir else run_dir_of(checkpoint) / "eval" / "cache"
    pools = {s.feature, "cls"} if "rank" in s.evals else {s.feature}
    img = cfg.model.img_size
    train, train_y, train_card, hit_tr = cached_features(model, sha, data, "train", img, layers, pools, s.max_train, s, cache_dir, device)
    test, test_y, test_card, hit_te = cached_features(model, sha, data, "test", img, layers, pools, s.max_test, s, cache_dir, device)
    # every torchrun rank helps extract the random encoder's features too; only rank 0 measures
    untrained = random_init_features(cfg, data, s, layers, pools, cache_dir, device) if s.baselines else None
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return None
    if train_y.unique().numel() < 2:
        raise UserError(f"{data.name}: the training split has labels of fewer than 2 classes; kNN and probes need labelled data")
    recipe = IN100_RECIPE if s.layer != "all" else FAST_RECIPE
    if s.probe_epochs:
        recipe = replace(recipe, epochs=s.probe_epochs)
    if s.probe_norm:
        recipe = replace(recipe, feature_norm=s.probe_norm)
    base = {"train": train_card, "test": test_card, "norm": "none", "checkpoint_sha256": sha}
    results, profile = [], []
    for layer in layers:
        row = {"layer": layer}
        card = {**base, "layer": layer, "feature": s.feature}
        if "knn" in s.evals:
            if s.knn_k > len(train_y):
                raise UserError(f"--k {s.knn_k} is larger than the kNN bank ({len(train_y)} training images); lower --k")
            v = knn_topk(train[(layer, s.feature)], train_y, test[(layer, s.feature)], test_y, s.knn_k, s.knn_temperature)
            results.append({"metric": "knn", "layer": layer, "feature": s.feature, "values": v,
                            "protocol": {**card, "k": s.knn_k, "temperature": s.knn_temperature, "vote": "exp(cos/T)"}})
            row["knn_top1"] = v["top1"]
        if "probe" in s.evals:
            v = linear_probe(train[(layer, s.feature)], train_y, test[(layer, s.feature)], test_y, recipe, device,
                             progress=s.progress and s.layer != "all")
            results.append({"metric": "probe", "layer": layer, "feature": s.feature, "values": v,
                            "protocol": {**card, "probe": recipe.card()}})
            row["probe_top1"] = v["top1"]
        if "rank" in s.evals:
            for feature in sorted(pools):
                r = effective_rank(test[(layer, feature)], exp=s.rank_exp)
                form = "exp(entropy) (Roy & Vetterli)" if s.rank_exp else "entropy of normalised covariance spectrum (paper eq. 6)"
                results.append({"metric": "rank", "layer": layer, "feature": feature, "values": {"effective_rank": r},
                                "protocol": {**base, "layer": layer, "feature": feature, "form": form, "split": "test"}})
                row[f"rank_{feature}"] = r
        profile.append(row)
    report = {"resdecay_eval": 1, "checkpoint": str(checkpoint), "checkpoint_sha256": sha,
              "alphas": {name: list(a) for name, a in alphas_of(model)},  # in use (learned values if learnable)
              "step": state["train_state"]["step"], "preset": cfg.preset, "label": _label(cfg),
              "model": dataclasses.asdict(cfg.model), "cache": {"dir": str(cache_dir), "train_hit": hit_tr, "test_hit": hit_te},
              "results": results}
    if s.baselines:
        report["baselines"] = baseline_rows(cfg, data, s, layers, untrained, recipe, base, device)
    if s.layer == "all":
        test_ds, _ = build_dataset(data, "test", img, augment=False)
        for row, st in zip(profile, block_statistics(model, test_ds, STATS_IMAGES, device)):
            row.update(st)
        report["profile"] = profile
        report["profile_protocol"] = {**base, "feature": s.feature, "probe": recipe.card(), "k": s.knn_k,
                                      "temperature": s.knn_temperature, "norm_statistics": f"first {STATS_IMAGES} test images, mean per-token L2 norm"}
    return report


def random_init_features(cfg, data: DataConfig, s: EvalSettings, layers: list[int], pools: set, cache_dir: Path,
                         device) -> tuple:
    """Features of the run's randomly initialised encoder (cached beside the model's, in random-init/)."""
    model = bl.random_init_model(cfg).to(device)
    key, img = bl.random_init_key(cfg), cfg.model.img_size
    train, train_y, _, _ = cached_features(model, key, data, "train", img, layers, pools, s.max_train, s,
                                           cache_dir / "random-init", device)
    test, test_y, _, _ = cached_features(model, key, data, "test", img, layers, pools, s.max_test, s,
                                         cache_dir / "random-init", device)
    return train, train_y, test, test_y


def baseline_rows(cfg, data: DataConfig, s: EvalSettings, layers: list[int], untrained: tuple, recipe, base: dict,
                  device) -> list[dict]:
    """The same measurements on raw pixels and on the run's randomly initialised encoder."""
    img = cfg.model.img_size
    card = {k: v for k, v in base.items() if k != "checkpoint_sha256"}
    (tr, tr_y), (te, te_y) = (bl.pixel_features(build_dataset(data, split, img, augment=False)[0], limit)
                              for split, limit in (("train", s.max_train), ("test", s.max_test)))
    rows = bl.measure("pixels", None, "pixels", tr, tr_y, te, te_y, None, s.evals, s, recipe, card, device)
    train, train_y, test, test_y = untrained
    for layer in layers:
        rows += bl.measure("random-init", layer, s.feature, train[(layer, s.feature)], train_y, test[(layer, s.feature)], test_y,
                           test.get((layer, "cls")), s.evals, s, recipe, {**card, "init_seed": cfg.train.seed}, device)
    return rows


def _label(cfg) -> str:
    return f"{cfg.preset} ({shortcut_tag(cfg.model.alpha_min, getattr(cfg.model, 'skips', False))})"


def format_report(report: dict) -> str:
    lines = [f"{report['label']} | {report['checkpoint']} (step {report['step']}, sha256 {report['checkpoint_sha256'][:12]})"]
    if "profile" in report:
        keys = [k for k in ("knn_top1", "probe_top1", "rank_cls", "rank_mean", "rank_patch_mean", "feature_norm",
                            "shortcut_ratio_attn", "shortcut_ratio_mlp") if any(k in r for r in report["profile"])]
        lines.append(f"{'layer':>5} " + " ".join(f"{k:>19}" for k in keys))
        for r in report["profile"]:
            lines.append(f"{r['layer']:>5} " + " ".join(f"{r.get(k, float('nan')):>19.4f}" for k in keys))
        return "\n".join(lines + _baseline_lines(report))
    lines.append(f"{'metric':<8} {'layer':>5} {'feature':<10} {'value':<32} protocol")
    for r in report["results"]:
        p = r["protocol"]
        vals = ", ".join(f"{k} {v:.4f}" for k, v in r["values"].items() if k in ("top1", "top5", "effective_rank"))
        extra = {"knn": lambda: f"k={p['k']} T={p['temperature']}",
                 "probe": lambda: (f"{p['probe']['name']} recipe, {p['probe']['epochs']} epochs, lr {p['probe']['lr']}, "
                                   f"feature norm {p['probe']['feature_norm']}"),
                 "rank": lambda: p["form"]}[r["metric"]]()
        split = f"test {p['test']['images']}" if r["metric"] == "rank" else f"train {p['train']['images']} -> test {p['test']['images']}"
        lines.append(f"{r['metric']:<8} {r['layer']:>5} {r['feature']:<10} {vals:<32} {p['train']['data']} {split}; {extra}")
    return "\n".join(lines + _baseline_lines(report))


def _baseline_lines(report: dict) -> list[str]:
    """Baselines as a short table: what pixels and an untrained encoder already give."""
    rows = report.get("baselines", [])
    if not rows:
        return []
    lines = ["baselines (same protocol): raw pixels and the randomly initialised encoder (seed "
             f"{next((r['protocol'].get('init_seed') for r in rows if 'init_seed' in r['protocol']), '-')})",
             f"{'source':<12} {'metric':<6} {'layer':>5} {'feature':<8} value"]
    for r in rows:
        v = ", ".join(f"{k} {x:.4f}" for k, x in r["values"].items() if k in ("top1", "top5", "effective_rank"))
        layer = "-" if r["layer"] is None else r["layer"]
        lines.append(f"{r['source']:<12} {r['metric']:<6} {layer:>5} {r['feature']:<8} {v}")
    return lines
