"""``resdecay eval``: one loop over the selected metrics' input sources (``sources.py``).

For a checkpoint, every selected metric's source checks its input before anything is extracted
(``check``), prepares the model's inputs block by block (``prepare``: cached pooled features, label maps
and patch tokens, ...), then the same over its baselines (raw pixels and the run's randomly initialised
encoder), and each metric measures each input, its numbers carrying their protocol card. With
``layer="all"`` it is the per-layer abstraction profile: every block's columns in one row per block,
the ``blocks`` source adding the token norms and the shortcut-to-branch ratios ||alpha*x|| / ||f(x)||.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ..data import DataConfig
from ..errors import UserError
from ..io import file_sha256, run_dir_of
from ..models import MAEConfig, is_diffusion
from ..nn.decayify import alphas_of
from ..nn.shortcut_info import describe_model
from ..train.checkpoint import load_checkpoint, load_model, loaded_plugins
from ..train.config import from_dict
from ..train.distributed import resolve_device
from ..train.log.tracking import log_to_run
from .diffusion.encoder import NoisedEncoder, NoisedRun
from .features.extract import POOLINGS
from .inputs import check_data_path, check_encoder_family
from .metrics import FEATURES, Metric, cached_rows, measure_prepared, registered, row_columns
from .options import checked
from .protocol import FAST_RECIPE, IN100_RECIPE, MetricSettings
from .sources import BASELINES, Evaluation, Source, get_source, source_kinds

# EvalSettings keys older grid files and scripts wrote for what are now metric options (``--k`` is knn.k)
LEGACY_KEYS = {"knn_k": ("knn", "k"), "knn_temperature": ("knn", "temperature"), "probe_epochs": ("probe", "epochs"),
               "probe_norm": ("probe", "feature_norm"), "rank_exp": ("rank", "exp"), "seg_data": ("segmentation", "data"),
               "seg_path": ("segmentation", "path")}
NO_CACHE = {"dir": "(none: no selected metric reads cached features)", "train_hit": False, "test_hit": False,
            "written": False}


@dataclass
class EvalSettings:
    """What ``resdecay eval`` measures and how; each metric's own knobs are its options (``metric_options``,
    ``--metric-option NAME.KEY=VALUE`` or the flags the metric declares, e.g. ``--k`` for ``knn.k``).

    Args:
        evals: the metrics to run (names; default: every ``features`` metric, a plugin's too).
        layer: the encoder block (``-1`` the last), or "all" for the per-layer profile.
        feature: the pooling kNN and the probe read: mean (all tokens incl. cls) | cls | patch_mean.
        data: the data set (None: the checkpoint's training data, without augmentation); data_path: with
            data=None, the checkpoint's data set read from this folder.
        max_train, max_test: N images of each split (class-balanced, data.subset_seed); None: all.
        batch_size, num_workers, device, progress: how features are extracted.
        cache_dir: the feature cache (default ``<run>/eval/cache``); pixel_cache: a folder of cached raw-pixel
            rows (``ablate``: ``baselines.default_baseline_cache()``).
        baselines: also measure raw pixels and the run's randomly initialised encoder.
        resize: read fixed-size images (digits, Fashion-MNIST, CIFAR) at the model's side (``--resize``; the
            checkpoint's data without ``data``; with ``data`` it is ``data.resize``).
        trackers: also log one layer's numbers to the run's trackers (TensorBoard, W&B, MLflow).
        noise_level: a diffusion checkpoint's blocks read at this fraction of the diffusion time (``--noise-level``).
        metric_options: metric name -> {key: value}, the metrics' own options.
    """

    evals: tuple[str, ...] = field(default_factory=lambda: tuple(m.name for m in registered(FEATURES)))
    layer: int | str = -1
    feature: str = "mean"
    data: DataConfig | None = None
    max_train: int | None = None
    max_test: int | None = None
    batch_size: int = 256
    num_workers: int = 0
    device: str = "auto"
    cache_dir: str | None = None
    progress: bool = True
    baselines: bool = True
    data_path: str | None = None
    pixel_cache: str | None = None
    resize: bool = False
    trackers: bool = True
    noise_level: float | None = None
    metric_options: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.layer != "all" and not isinstance(self.layer, int):  # the command line's text
            try:
                self.layer = int(self.layer)
            except ValueError:
                raise UserError(f"--layer must be a block index (e.g. -1 for the last) or 'all', got {self.layer!r}") from None

    @classmethod
    def from_dict(cls, d: dict) -> EvalSettings:
        """Settings from a grid file's ``eval:`` section, whose older keys (``probe_epochs``, ``knn_k``, ...)
        set the metric options they became."""
        d, options = dict(d), {}
        for key, (name, option) in LEGACY_KEYS.items():
            if key in d:
                options.setdefault(name, {})[option] = d.pop(key)
        given = d.pop("metric_options", {}) or {}
        merged = {n: {**options.get(n, {}), **given.get(n, {})} for n in [*options, *given]}
        if isinstance(d.get("evals"), list):
            d["evals"] = tuple(d["evals"])
        return cls(**d, metric_options=merged)

    def validate(self) -> None:
        names = [m.name for m in registered(where="eval")]  # the --evals choices: what runs on one layer
        bad = [e for e in self.evals if e not in names]
        if bad or not self.evals:
            raise UserError(f"unknown evaluation {bad[0] if bad else '(none)'!r}; choose from {', '.join(names)}")
        one_block = [m.name for m in registered(where="eval") if m.name in self.evals and "profile" not in m.where]
        if self.layer == "all" and one_block:  # e.g. segmentation: not a per-layer measurement
            raise UserError(f"{one_block[0]} measures one block: pass --layer N (or -1 for the last), not --layer all")
        if self.feature not in POOLINGS:
            raise UserError(f"--feature {self.feature!r} is unknown; choose one of {', '.join(POOLINGS)}")
        for flag, value in (("--max-train", self.max_train), ("--max-test", self.max_test), ("--batch-size", self.batch_size)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be a positive integer, got {value}")
        if self.num_workers < 0:
            raise UserError(f"--num-workers must be 0 (load in this process) or more, got {self.num_workers}")
        self.options()  # an unknown metric or key, a value of the wrong type or range: refused before extracting

    def options(self) -> dict[str, dict[str, Any]]:
        """Every metric option this evaluation sets, typed and in its declared range (one line otherwise)."""
        return checked(self.metric_options, [m.name for m in registered()])

    def unused_options(self) -> list[str]:
        """--metric-option names of metrics this evaluation does not run: set, but ignored."""
        return [f"{name}.{key}" for name, values in self.metric_options.items() if name not in self.evals
                for key in values]

    def plan(self) -> list[tuple[Source, list[Metric]]]:
        """(source, its selected metrics) in registration order: the metrics ``evals`` names that run on one
        layer or in the profile, and a profile-only source's metrics (the blocks' norms) in the profile."""
        where, out = "profile" if self.layer == "all" else "eval", []
        for kind in source_kinds():
            source = get_source(kind)
            if source.profile_only and self.layer != "all":
                continue
            metrics = [m for m in registered(kind, where) if m.name in self.evals or source.profile_only]
            if metrics:
                out.append((source, metrics))
        return out

    def metrics(self, kind: str = FEATURES) -> list[Metric]:
        """The selected metrics of one input kind, in registry order (the order of eval.json's rows)."""
        return [m for source, metrics in self.plan() if source.kind == kind for m in metrics]

    def pools(self) -> set[str]:
        """The poolings to extract: the feature, and those a selected metric also reads (rank: cls)."""
        return {self.feature, *(p for m in self.metrics() for p in m.extra_pools)}

    def metric_settings(self, device: str | torch.device = "cpu") -> MetricSettings:
        """The protocol the metrics run under: the IN-100 probe for one layer, the fast one for the profile
        (its epochs and feature norm are the probe metric's options), and every metric's options."""
        recipe = IN100_RECIPE if self.layer != "all" else FAST_RECIPE
        return MetricSettings(probe=recipe, device=device, progress=self.progress and self.layer != "all",
                              options=self.options())


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
    check_encoder_family(checkpoint, cfg.model.family, s.noise_level)
    if s.data is not None:
        check_data_path(s.data.name, s.data.path)
        # a diffusion model reads images in its own range ([-1, 1]: normalize symmetric), whatever --data's default
        return state, cfg, replace(s.data, normalize=cfg.data.normalize) if is_diffusion(cfg.model.family) else s.data
    check_data_path(cfg.data.name, s.data_path)
    return state, cfg, replace(cfg.data, augment="none", train_subset=None, path=s.data_path or cfg.data.path,
                               resize=cfg.data.resize or s.resize)


def measured_layers(model, layer: int | str) -> list[int]:
    """The blocks ``--layer`` names (every block for ``all``), checked against the model's depth."""
    depth = len(model.blocks)
    if layer == "all":
        return list(range(depth))
    if not -depth <= int(layer) < depth:
        raise UserError(f"--layer {layer} is out of range: the encoder has {depth} blocks (0..{depth - 1}, or -1 for the last)")
    return [int(layer) % depth]


def open_evaluation(checkpoint: str | Path, s: EvalSettings, report_dir: str | Path | None = None) -> Evaluation:
    """The checkpoint checked and loaded, its blocks chosen: what every source reads."""
    checkpoint = Path(checkpoint)
    state, cfg, data = checked_checkpoint(checkpoint, s)
    device = resolve_device(s.device, "--device")
    diffusion = is_diffusion(cfg.model.family)
    model, cfg = load_model(checkpoint, device, ema=diffusion, state=state)  # the EMA weights, as eval-diffusion
    inputs_card, label = {}, _label(cfg)
    if diffusion:  # its blocks' tokens at one noise level, the null label
        model, cfg = NoisedEncoder(model, s.noise_level), NoisedRun(cfg, s.noise_level)
        inputs_card = model.card("EMA" if "ema" in state else "raw")
        label = f"{label}, noise {s.noise_level:g}"
    ev = Evaluation(checkpoint, file_sha256(checkpoint), state, cfg, model, data, s, measured_layers(model, s.layer), device,
                    Path(report_dir) if report_dir else run_dir_of(checkpoint) / "eval",
                    cache_dir=run_dir_of(checkpoint) / "eval" / "cache", inputs_card=inputs_card)
    return described(ev, label)


def described(ev: Evaluation, label: str) -> Evaluation:
    """``ev`` with ``about`` set when it is opened: what was evaluated, the report's first keys (the file and its
    SHA-256, the alphas in use, the step, preset, label and model config)."""
    ev.about = {"checkpoint": str(ev.checkpoint), "checkpoint_sha256": ev.sha,
                "alphas": {name: list(a) for name, a in alphas_of(ev.model)},  # in use (learned values if learnable)
                "step": ev.state["train_state"]["step"], "preset": ev.cfg.preset, "label": label,
                "model": dataclasses.asdict(ev.cfg.model)}
    return ev


def _inputs(inputs, source: Source) -> list:
    """A source's prepared inputs, made now; under torchrun on every rank when its extraction is shared."""
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    return list(inputs) if rank0 or source.every_rank else []


def evaluate_checkpoint(checkpoint: str | Path, s: EvalSettings, report_dir: str | Path | None = None) -> dict | None:
    """Evaluate one checkpoint; returns the report (None on non-zero torchrun ranks, which help extract).

    Args:
        checkpoint: a resdecay checkpoint of an encoder (MAE, classifier, ResNet).
        s: the evaluation settings.
        report_dir: where the report goes (default ``<run>/eval``); lists of unreadable images
            replaced under the run's ``data.on_bad_file=skip`` are written there.
    """
    ev = open_evaluation(checkpoint, s, report_dir)
    report = evaluate(ev, s)
    if report is not None and s.trackers and not ev.profile and report["step"] is not None:
        log_to_trackers(report, ev.state, ev.checkpoint)  # the run's own trackers: its numbers at the checkpoint's step
    return report


def evaluate(ev: Evaluation, s: EvalSettings) -> dict | None:
    """One opened evaluation (a checkpoint's, or a foreign model's): every selected source checks, prepares,
    the same over the baselines, then each metric measures each input."""
    plan = s.plan()
    for source, metrics in plan:  # every input checked before any is extracted
        if source.check is not None:
            source.check(ev, metrics)
    work = [(source, metrics, None, _inputs(source.prepare(ev, metrics), source)) for source, metrics in plan]
    for source, metrics in plan if s.baselines else []:  # the same metrics on raw pixels and the random encoder
        ms = [m for m in metrics if "baselines" in m.where]
        work += [(source, ms, name, _inputs(source.baseline(ev, ms, name), source)) for name in BASELINES
                 if ms and source.baseline is not None]
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return None
    settings, measured = s.metric_settings(ev.device), {"results": [], "baselines": [], "profile": {}, "cards": []}
    for source, metrics, baseline, inputs in work:
        for p in inputs:
            quiet = replace(settings, progress=False) if baseline else settings
            rows, columns = measure_prepared(metrics, p, quiet, baseline)
            measured["baselines" if baseline else "results"] += rows if source.rows else []
            if baseline is None and ev.profile:
                measured["profile"].setdefault(p.layer, {"layer": p.layer}).update(columns)
                measured["cards"].append(p.card)
    return _report(ev, plan, measured, settings)


def evaluate_pixels(data: DataConfig, side: int, s: EvalSettings) -> tuple[list[dict], dict]:
    """The raw-pixel baseline of a data set alone, no checkpoint (``resdecay eval --baseline pixels``): the
    ``features`` source's ``pixels`` input, its rows cached in ``s.pixel_cache``. Returns (rows, {"file", "hit"})."""
    ev = Evaluation(None, None, {}, None, None, data, s, [], resolve_device(s.device, "--device"), None, side=side)
    metrics = [m for m in s.metrics() if "baselines" in m.where]
    (prepared,) = get_source(FEATURES).baseline(ev, metrics, "pixels")
    hit = cached_rows(prepared.rows_cache) is not None
    rows = measure_prepared(metrics, prepared, replace(s.metric_settings(ev.device), progress=False), "pixels")[0]
    return rows, {"file": str(prepared.rows_cache) if prepared.rows_cache else None, "hit": hit}


def _report(ev: Evaluation, plan: list, measured: dict, settings: MetricSettings) -> dict:
    """The report: what was evaluated, its rows, the cache and bad-file notes, baselines and the profile."""
    s = ev.settings
    report = {"resdecay_eval": 1, **ev.about, "plugins": loaded_plugins(),
              "results": sorted(measured["results"], key=lambda r: r["layer"]) if ev.profile else measured["results"],
              "cache": ev.notes.get("cache", NO_CACHE), **{k: v for k, v in ev.notes.items() if k != "cache"}}
    if measured["baselines"]:
        report["baselines"] = measured["baselines"]
    if ev.profile:
        report["profile"] = list(measured["profile"].values())
        cards = {k: v for _, metrics in plan for m in metrics for k, v in m.protocol(settings).items()}
        report["profile_protocol"] = {**measured["cards"][0], "feature": s.feature, **cards}
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


def _label(cfg) -> str:
    skips = cfg.model.skips if isinstance(cfg.model, MAEConfig) else False  # only the MAE has long skips
    return f"{cfg.preset} ({describe_model(cfg.model, skips)})"
