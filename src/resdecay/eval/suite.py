"""``resdecay eval``: frozen features extracted once per (checkpoint, data, protocol) and cached
on disk, then every registered ``features`` metric (``eval/metrics.py``: kNN, linear probe, effective
rank, and any a plugin registers), each number carrying its protocol card.

With ``layer="all"`` it is the per-layer abstraction profile: for every encoder block the same
metrics (the probe with the fast recipe) plus the ``blocks`` metrics: the mean token norm and the
shortcut-to-branch norm ratio ||alpha*x|| / ||f(x)|| of both sub-blocks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..data import DataConfig, check_first_sample
from ..data.subsets import balanced_subset
from ..errors import UserError
from ..io import file_sha256, run_dir_of
from ..models import MAEConfig
from ..nn.blocks import block_statistics as record_block_statistics
from ..nn.decayify import alphas_of
from ..nn.shortcut_info import describe_model
from ..train.checkpoint import load_checkpoint, load_model, loaded_plugins
from ..train.config import from_dict
from ..train.distributed import resolve_device
from ..train.log.tracking import log_to_run
from . import baselines as bl
from . import segmentation_eval as seg_eval
from .feature_cache import FeatureCache
from .features import POOLINGS, extract_block_features
from .inputs import (
    bad_files_list,
    check_data_path,
    check_encoder_family,
    check_writable,
    eval_split,
    replaced_count,
    replaced_list,
    restore_replaced,
    split_card,
)
from .metrics import (
    BLOCKS,
    FEATURES,
    LAYERS,
    SEGMENTATION,
    BlockStats,
    FeatureSet,
    LayerSet,
    Metric,
    measure,
    metric_names,
    registered,
    row_columns,
)
from .options import checked
from .protocol import FAST_RECIPE, IN100_RECIPE, KNN_K, KNN_TEMPERATURE, STATS_IMAGES, MetricSettings
from .segmentation import SegProtocol

FEATURE_FORMAT = 1  # bump when extraction changes, so old caches are not reused
OPTION_FLAGS = {"knn.k": "--k", "knn.temperature": "--temperature", "probe.epochs": "--probe-epochs",
                "probe.feature_norm": "--probe-norm", "rank.exp": "--rank-exp", "segmentation.solver": "--seg-solver",
                "segmentation.k": "--seg-k", "segmentation.images": "--seg-images", "segmentation.seed": "--seg-seed",
                "segmentation.ignore_index": "--seg-ignore-index"}


@dataclass
class EvalSettings:
    # the registered ``features`` metrics to run; default: all of them (a plugin's too)
    evals: tuple[str, ...] = field(default_factory=lambda: metric_names(FEATURES))
    layer: int | str = -1  # encoder block index, or "all" for the per-layer profile
    feature: str = "mean"  # pooling for kNN and probe: mean (all tokens incl. cls) | cls | patch_mean
    knn_k: int = KNN_K
    knn_temperature: float = KNN_TEMPERATURE
    probe_epochs: int | None = None  # None: 200 (IN-100 recipe) for one layer, 30 (fast) for the profile
    probe_norm: str | None = None  # None: the recipe's (none for IN-100, batchnorm for fast) | none | batchnorm
    rank_exp: bool = False  # False: paper eq. 6 (entropy); True: exp of it (Roy & Vetterli)
    data: DataConfig | None = None  # None: the checkpoint's training data, without augmentation
    max_train: int | None = None  # N training images (class-balanced, data.subset_seed) as the kNN bank / probe set
    max_test: int | None = None  # N test images, drawn the same way
    batch_size: int = 256
    num_workers: int = 0
    device: str = "auto"
    cache_dir: str | None = None  # default: <run>/eval/cache
    progress: bool = True
    baselines: bool = True  # also measure raw pixels and the run's randomly initialised encoder (eval/baselines.py)
    data_path: str | None = None  # with data=None: the checkpoint's data set, read from this folder
    pixel_cache: str | None = None  # a folder of cached raw-pixel baseline rows (ablate: baselines.default_baseline_cache())
    trackers: bool = True  # also log one layer's numbers to the training run's trackers (train.loggers: TensorBoard, W&B, MLflow)
    segmentation: SegProtocol = field(default_factory=SegProtocol)  # --evals segmentation: its protocol
    seg_data: str | None = None  # label maps from: a seg_masks.SEG_DATA name, or NAME:DIR (default: the evaluation's data)
    seg_path: str | None = None  # the cocostuff27 / voc / folder folder
    # metric name -> {key: value}: the metrics' own options (--metric-option NAME.KEY=VALUE; they win over the
    # built-in flags above, which set the same options: --k is knn.k, --seg-solver is segmentation.solver)
    metric_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def validate(self) -> None:
        names = metric_names(FEATURES) + metric_names(LAYERS) + metric_names(SEGMENTATION)  # the last two: opt-in
        bad = [e for e in self.evals if e not in names]
        if bad or not self.evals:
            raise UserError(f"unknown evaluation {bad[0] if bad else '(none)'!r}; choose from {', '.join(names)}")
        if self.feature not in POOLINGS:
            raise UserError(f"--feature {self.feature!r} is unknown; choose one of {', '.join(POOLINGS)}")
        if self.probe_norm not in (None, "none", "batchnorm"):
            raise UserError(f"--probe-norm {self.probe_norm!r} is unknown; choose none or batchnorm")
        for flag, value in (("--max-train", self.max_train), ("--max-test", self.max_test)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be a positive integer, got {value}")
        self.options()  # an unknown metric or key, a value of the wrong type or range: refused before extracting

    def options(self) -> dict[str, dict[str, Any]]:
        """Every metric option this evaluation sets, typed and in its declared range (one line naming the
        flag or ``--metric-option`` otherwise): the built-in metrics' flags, then --metric-option's."""
        known = [m.name for m in registered()]
        flags = checked({"knn": {"k": self.knn_k, "temperature": self.knn_temperature}, "rank": {"exp": self.rank_exp},
                         "probe": {"epochs": self.probe_epochs, "feature_norm": self.probe_norm},
                         "segmentation": dataclasses.asdict(self.segmentation)}, known, OPTION_FLAGS)
        given = checked(self.metric_options, known)
        return {name: {**flags.get(name, {}), **given.get(name, {})} for name in [*flags, *given]}

    def unused_options(self) -> list[str]:
        """--metric-option names of metrics this evaluation does not run: set, but ignored."""
        return [f"{name}.{key}" for name, values in self.metric_options.items() if name not in self.evals
                for key in values]

    def metrics(self) -> list[Metric]:
        """The selected ``features`` metrics, in registry order (the order of eval.json's rows)."""
        return [m for m in registered(FEATURES, "profile" if self.layer == "all" else "eval") if m.name in self.evals]

    def layer_metrics(self) -> list[Metric]:
        """The selected ``layers`` metrics (they read every block's test features), in registry order."""
        return [m for m in registered(LAYERS, "profile" if self.layer == "all" else "eval") if m.name in self.evals]

    def pools(self) -> set[str]:
        """The poolings to extract: the feature, and those a selected metric also reads (rank: cls)."""
        return {self.feature, *(p for m in self.metrics() for p in m.extra_pools)}

    def metric_settings(self, device: str | torch.device = "cpu") -> MetricSettings:
        """The protocol the metrics run under: the IN-100 probe for one layer, the fast one for the profile
        (its epochs and feature norm are the probe metric's options), and every metric's options."""
        recipe = IN100_RECIPE if self.layer != "all" else FAST_RECIPE
        return MetricSettings(probe=recipe, device=device, progress=self.progress and self.layer != "all",
                              options=self.options())


def cached_features(model, ckpt_sha: str, data: DataConfig, split: str, img_size: int, layers: list[int],
                    pools: tuple[str, ...], limit: int | None, s: EvalSettings, cache: FeatureCache, device,
                    bad_files: Path | None = None) -> tuple:
    """Features of one split, from the cache when the same checkpoint, data and protocol were
    extracted before. Returns (feats, labels, data card, cache hit).

    Args:
        model, ckpt_sha: the encoder and its identity (the cache key); data, split, img_size, limit:
        the images; layers, pools: which features; s: the settings; cache: the feature cache;
        device: where to extract; bad_files: the folder listing unreadable images replaced under the
        run's ``data.on_bad_file=skip`` (None: the first unreadable image stops the evaluation).
    """
    dataset = eval_split(data, split, img_size, bad_files)
    check_first_sample(dataset, model.cfg.in_chans, img_size, data.name)
    total = len(dataset)
    dataset = balanced_subset(dataset, limit, data.subset_seed)  # an ImageFolder's first N are a class or two
    if split == "train":  # settings that cannot work on this bank are refused before extracting, not after
        for m in [*s.metrics(), *s.layer_metrics()]:
            if m.check is not None:
                m.check(len(dataset), s.metric_settings())
    card = split_card(data, split, len(dataset), total, img_size)  # a subset's draw is in the key: no first-N reuse
    key = {"format": FEATURE_FORMAT, "checkpoint_sha256": ckpt_sha, **card, "layers": layers, "pools": sorted(pools)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    file = cache.dir / f"{split}-{digest}.pt"
    cached = cache.load(file, [(l, p) for l in layers for p in pools], len(dataset))
    skip = data.on_bad_file == "skip" and bad_files is not None
    if cached is not None:
        feats, labels, blob = cached
        if skip:  # extracted under the same policy: the files it replaced are kept with the features
            card["unreadable_replaced"] = restore_replaced(bad_files, split, blob.get("unreadable_list", ""))
        return feats, labels, card, True
    feats, labels = extract_block_features(model, dataset, layers, tuple(sorted(pools)), s.batch_size, device,
                                           s.num_workers, s.progress, desc=f"features ({split})")
    if skip:  # in the card: these numbers are of a data set where some images stand in for unreadable ones
        card["unreadable_replaced"] = replaced_count(bad_files, split)
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        cache.save({"feats": {f"{l}:{p}": v for (l, p), v in feats.items()}, "labels": labels, "key": json.dumps(key),
                    "unreadable_list": replaced_list(bad_files, split) if skip else ""}, file)
    return feats, labels, card, False


@torch.no_grad()
def block_norms(model, dataset, n: int, device) -> list[dict]:
    """Per-block mean token norms on the first ``n`` images (``nn.blocks.block_statistics``): of the
    output, and of the scaled shortcut and the branch of the attention and MLP sub-blocks."""
    images = torch.stack([dataset[i][0] for i in range(min(n, len(dataset)))]).to(device)
    with record_block_statistics(model.blocks) as stats:
        model.forward_intermediates(images, [len(model.blocks) - 1])
    return stats


def checked_checkpoint(checkpoint: str | Path, s: EvalSettings) -> tuple[dict, object, DataConfig]:
    """What can be checked before a feature is extracted: the settings, the file, the model family
    and the data path (bad input costs a second, not an evaluation).

    Args:
        checkpoint: a resdecay checkpoint.
        s: the evaluation settings.

    Returns:
        (checkpoint state, its RunConfig, the data config the evaluation reads).
    """
    s.validate()
    state = load_checkpoint(checkpoint)
    cfg = from_dict(state["config"])
    check_encoder_family(checkpoint, cfg.model.family)
    if s.data is not None:
        check_data_path(s.data.name, s.data.path)
        return state, cfg, s.data
    check_data_path(cfg.data.name, s.data_path)
    return state, cfg, replace(cfg.data, augment="none", train_subset=None, path=s.data_path or cfg.data.path)


def _layers(model, layer: int | str) -> list[int]:
    depth = len(model.blocks)
    if layer == "all":
        return list(range(depth))
    if not -depth <= int(layer) < depth:
        raise UserError(f"--layer {layer} is out of range: the encoder has {depth} blocks (0..{depth - 1}, or -1 for the last)")
    return [int(layer) % depth]


def _bad_files_folder(data: DataConfig, report_dir: Path) -> Path | None:
    """Under the run's ``data.on_bad_file=skip``: the report folder, where the replaced files are
    listed (fresh lists for this evaluation); None under ``stop``."""
    if data.on_bad_file != "skip":
        return None
    check_writable(report_dir, "pass --out DIR")
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        for split in ("train", "test"):
            bad_files_list(report_dir, split).unlink(missing_ok=True)
    if torch.distributed.is_initialized():  # no rank lists a file before rank 0 cleared the old lists
        torch.distributed.barrier()
    return report_dir


def feature_set(train: dict, train_y, test: dict, test_y, layer: int, pools: list[str], feature: str) -> FeatureSet:
    """One layer's features as the metrics read them, poolings in the order given (rank rows follow it)."""
    return FeatureSet({p: train[(layer, p)] for p in pools}, train_y, {p: test[(layer, p)] for p in pools}, test_y, feature)


def layer_set(test: dict, test_y, blocks: list[int], layer: int, feature: str) -> LayerSet:
    """The test features of every block as a ``layers`` metric reads them, evaluating ``layer``."""
    return LayerSet(layer, {b: test[(b, feature)] for b in blocks}, test_y, feature)


def evaluate_checkpoint(checkpoint: str | Path, s: EvalSettings, report_dir: str | Path | None = None) -> dict | None:
    """Evaluate one checkpoint; returns the report (None on non-zero torchrun ranks).

    Args:
        checkpoint: a resdecay checkpoint of an encoder (MAE, classifier, ResNet).
        s: the evaluation settings.
        report_dir: where the report goes (default ``<run>/eval``); lists of unreadable images
            replaced under the run's ``data.on_bad_file=skip`` are written there.
    """
    checkpoint = Path(checkpoint)
    state, cfg, data = checked_checkpoint(checkpoint, s)
    device = resolve_device(s.device, "--device")
    model, cfg = load_model(checkpoint, device, state=state)
    layers = _layers(model, s.layer)
    seg = seg_eval.prepare(model, data, s, layers)  # label maps read and settings checked before any extraction
    if not s.metrics() and not s.layer_metrics():
        return _segmentation_only(checkpoint, state, cfg, model, seg, s, layers, device)
    bad_files = _bad_files_folder(data, Path(report_dir) if report_dir else run_dir_of(checkpoint) / "eval")
    sha = file_sha256(checkpoint)
    cache = FeatureCache.open(Path(s.cache_dir) if s.cache_dir else run_dir_of(checkpoint) / "eval" / "cache")
    pools, img = s.pools(), cfg.model.img_size
    train, train_y, train_card, hit_tr = cached_features(model, sha, data, "train", img, layers, pools, s.max_train, s,
                                                         cache, device, bad_files)
    blocks = list(range(len(model.blocks))) if s.layer_metrics() else layers  # a layers metric reads every block
    test, test_y, test_card, hit_te = cached_features(model, sha, data, "test", img, blocks, pools, s.max_test, s,
                                                      cache, device, bad_files)
    # every torchrun rank helps extract the random encoder's features too; only rank 0 measures
    baselines = s.baselines and bool(s.metrics())  # the baselines measure the features metrics
    untrained = random_init_features(cfg, data, s, layers, pools, cache, device, bad_files) if baselines else None
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return None
    if train_y.unique().numel() < 2:
        raise UserError(f"{data.name}: the training split has labels of fewer than 2 classes; kNN and probes need labelled data")
    ms = s.metric_settings(device)
    base = {"train": train_card, "test": test_card, "norm": "none", "checkpoint_sha256": sha}
    results, profile = [], []
    for layer in layers:
        rows, columns = measure(s.metrics(), feature_set(train, train_y, test, test_y, layer, sorted(pools), s.feature),
                                ms, base, layer)
        more, also = measure(s.layer_metrics(), layer_set(test, test_y, blocks, layer, s.feature), ms, base, layer)
        results += rows + more
        profile.append({"layer": layer, **columns, **also})
    report = {"resdecay_eval": 1, "checkpoint": str(checkpoint), "checkpoint_sha256": sha,
              "alphas": {name: list(a) for name, a in alphas_of(model)},  # in use (learned values if learnable)
              "step": state["train_state"]["step"], "preset": cfg.preset, "label": _label(cfg),
              "model": dataclasses.asdict(cfg.model), "plugins": loaded_plugins(), "results": results,
              "cache": {"dir": str(cache.dir), "train_hit": hit_tr, "test_hit": hit_te, "written": cache.writable}}
    if bad_files is not None:
        report["bad_files"] = {"policy": "data.on_bad_file=skip (the run's): an unreadable image is replaced by the next readable one",
                               **{split: str(bad_files_list(bad_files, split)) for split in ("train", "test")}}
    if baselines:
        report["baselines"] = baseline_rows(cfg, data, s, layers, untrained, base, device, bad_files)
    if seg is not None:
        _add_segmentation(report, seg, cfg, model, s, layers, device)
    if s.layer == "all":
        block_metrics = registered(BLOCKS, "profile")
        for row, norms in zip(profile, block_norms(model, eval_split(data, "test", img, bad_files), STATS_IMAGES, device), strict=False):
            row.update(measure(block_metrics, BlockStats(row["layer"], norms), ms, base, row["layer"])[1])
        report["profile"] = profile
        cards = {k: v for m in [*s.metrics(), *block_metrics] for k, v in m.protocol(ms).items()}
        report["profile_protocol"] = {**base, "feature": s.feature, **cards}
    elif s.trackers:
        log_to_trackers(report, state, checkpoint)
    return report


def _add_segmentation(report: dict, seg, cfg, model, s: EvalSettings, layers: list[int], device) -> None:
    """The segmentation rows (and their pixel / random-init baselines) appended to a report."""
    untrained = bl.random_init_model(cfg) if s.baselines else None
    rows, base = seg_eval.measure_segmentation(seg, model, layers[0], s, s.metric_settings(device),
                                               report["checkpoint_sha256"], device, untrained, cfg.train.seed)
    report["results"] += rows
    if s.baselines:
        report.setdefault("baselines", []).extend(base)


def _segmentation_only(checkpoint: Path, state: dict, cfg, model, seg, s: EvalSettings, layers: list[int], device):
    """``--evals segmentation`` alone: no pooled features are extracted (rank 0 measures under torchrun)."""
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return None
    report = {"resdecay_eval": 1, "checkpoint": str(checkpoint), "checkpoint_sha256": file_sha256(checkpoint),
              "alphas": {name: list(a) for name, a in alphas_of(model)}, "step": state["train_state"]["step"],
              "preset": cfg.preset, "label": _label(cfg), "model": dataclasses.asdict(cfg.model),
              "plugins": loaded_plugins(), "results": [],
              "cache": {"dir": "(none: segmentation reads no cached features)", "train_hit": False, "test_hit": False,
                        "written": False}}
    _add_segmentation(report, seg, cfg, model, s, layers, device)
    return report


def log_to_trackers(report: dict, state: dict, checkpoint: Path) -> None:
    """The report's numbers (``eval/<column>``, e.g. ``eval/knn_top1``) into the trackers of the run
    that wrote the checkpoint, at its step: its TensorBoard events, and the W&B / MLflow runs the
    checkpoint names. Only for a checkpoint in a training run's folder (one with a ``log.jsonl``)."""
    run_dir = run_dir_of(checkpoint)
    if not (run_dir / "log.jsonl").is_file():
        return
    values = {f"eval/{k}": v for row in report["results"] for k, v in row_columns(row).items()
              if isinstance(v, (int, float)) and not isinstance(v, bool)}
    log_to_run(run_dir, state["config"], state["train_state"].get("trackers"), values, report["step"])


def random_init_features(cfg, data: DataConfig, s: EvalSettings, layers: list[int], pools: set, cache: FeatureCache,
                         device, bad_files: Path | None = None) -> tuple:
    """Features of the run's randomly initialised encoder (cached beside the model's, in random-init/)."""
    model = bl.random_init_model(cfg).to(device)
    key, img = bl.random_init_key(cfg), cfg.model.img_size
    train, train_y, _, _ = cached_features(model, key, data, "train", img, layers, pools, s.max_train, s,
                                           cache.sub("random-init"), device, bad_files)
    test, test_y, _, _ = cached_features(model, key, data, "test", img, layers, pools, s.max_test, s,
                                         cache.sub("random-init"), device, bad_files)
    return train, train_y, test, test_y


def baseline_rows(cfg, data: DataConfig, s: EvalSettings, layers: list[int], untrained: tuple, base: dict,
                  device, bad_files: Path | None = None) -> list[dict]:
    """The same metrics on raw pixels and on the run's randomly initialised encoder, rows with a ``source``."""
    card = {k: v for k, v in base.items() if k != "checkpoint_sha256"}
    metrics = [m for m in s.metrics() if "baselines" in m.where]
    ms = replace(s.metric_settings(device), progress=False)
    rows = bl.pixel_rows(data, cfg.model.img_size, metrics, ms, s.max_train, s.max_test, bad_files, s.pixel_cache)[0]
    train, train_y, test, test_y = untrained
    pools = [s.feature, *sorted(s.pools() - {s.feature})]  # the feature first, as the baseline rows always listed it
    for layer in layers:
        fs = feature_set(train, train_y, test, test_y, layer, pools, s.feature)
        rows += measure(metrics, fs, ms, {**card, "init_seed": cfg.train.seed}, layer, "random-init")[0]
    return rows


def _label(cfg) -> str:
    skips = cfg.model.skips if isinstance(cfg.model, MAEConfig) else False  # only the MAE has long skips
    return f"{cfg.preset} ({describe_model(cfg.model, skips)})"
