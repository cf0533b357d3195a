"""``resdecay eval``, ``compare`` and ``eval-diffusion``: measure checkpoints and write the
reports (JSON with protocol cards, PNG profiles, heat maps); ``resdecay eval --baseline pixels``:
the raw-pixel baseline of a data set alone, without a checkpoint (cached per data set and protocol,
the cache ``ablate`` reads too)."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist
import yaml

from ..data import DataConfig, build_dataset
from ..data.subsets import balanced_subset
from ..errors import UserError, one_line
from ..eval.compare import compare_reports, format_comparison, load_report
from ..eval.diffusion.probe import FAST_RECIPE, NOISE_LEVELS, check_levels, probe_grid
from ..eval.features.baselines import default_baseline_cache
from ..eval.inputs import check_data_path, check_writable, removed_if_refused, write_failure
from ..eval.metrics import FEATURES, flag_options, metric_names
from ..eval.options import parse_assignments
from ..eval.probing.leaderboard import export_rows
from ..eval.reports import format_report, protocol_text, values_text
from ..eval.suite import EvalSettings, evaluate_pixels
from ..eval.targets import DEFAULT_OUT, CheckpointTarget, ForeignTarget, Target, as_target
from ..interop.foreign_model import load_foreign
from ..io import run_dir_of
from ..models import is_diffusion
from ..train import distributed as dist_env
from ..train.checkpoint import load_checkpoint, load_model
from ..train.config import from_dict
from ..train.distributed import is_main_process, resolve_device
from ..viz.diagnostics_figures import eval_note, plot_diagnostics
from ..viz.plots import plot_bars, plot_grid, plot_profile
from .options import data_config, noise_levels


def check_eval_inputs(reports: dict[Target, Path], settings: EvalSettings, out: str | None = None) -> None:
    """Every target, option and output folder, checked before the first feature is extracted:
    a bad second checkpoint, a U-ViT among MAEs or a read-only run folder must not cost the first
    checkpoint's evaluation.

    Args:
        reports: each target's report folder; settings: the evaluation settings; out: ``--out`` or None.
    """
    for target in reports:
        target.check(settings)
    fix = "pass --out DIR (a folder you can write)" if out is None else "pass --out with a folder you can write"
    for folder in reports.values():
        check_writable(folder, fix)
    if settings.layer == "all" and len(reports) > 1:
        check_writable(Path(out or DEFAULT_OUT), fix)


def _write_report(folder: Path, name: str, report: dict, layer) -> None:
    text = json.dumps(report, indent=2)
    try:
        (folder / f"{name}.json").write_text(text)
        if layer == "all":
            plot_profile({report["label"]: report["profile"]}, folder / "profile.png")
    except OSError as e:  # checked writable up front; a disk that filled up since still ends in one line
        raise UserError(write_failure(folder / f"{name}.json", e, "free some space or pass --out DIR", len(text))) from None


def _bad_files_note(report: dict) -> str | None:
    """One line when the run's data.on_bad_file=skip replaced images: the numbers are of that data set."""
    if "bad_files" not in report or not report["results"]:
        return None
    card = report["results"][0]["protocol"]
    n = {split: card[split].get("unreadable_replaced", 0) for split in ("train", "test")}
    if not any(n.values()):
        return None
    return (f"note: {n['train']} train and {n['test']} test image(s) were unreadable and replaced by the next readable one "
            f"(the run's data.on_bad_file=skip); listed in {report['bad_files']['train']} and {report['bad_files']['test']}")


def _protocol_note(settings: EvalSettings) -> str:
    """One line under a profile overlay: the feature and each metric's protocol, from the registry."""
    ms = settings.metric_settings()
    return "; ".join([f"feature {settings.feature}", *(f"{m.display.label}: {m.display.describe(m.protocol(ms))}" for m in settings.metrics())])


def run_eval(targets: list, settings: EvalSettings, out: str | None = None) -> dict:
    """``_evaluate_all`` of checkpoint files, models trained elsewhere (``load_foreign``'s) and other
    ``eval.targets.Target``s; a refused evaluation removes the report and cache folders it created and left empty."""
    reports = {t: t.report_dir(out) for t in map(as_target, targets)}
    folders = [*reports.values()] + [Path(out or DEFAULT_OUT)] * (settings.layer == "all")
    folders += [Path(settings.cache_dir) if settings.cache_dir else t.cache_dir(folder) for t, folder in reports.items()]
    with removed_if_refused(folders):
        return _evaluate_all(reports, settings, out)


def _evaluate_all(reports: dict[Target, Path], settings: EvalSettings, out: str | None = None) -> dict:
    """Evaluate each target, write ``eval.json`` (or ``profile.json`` + PNG with ``layer="all"``)
    and, for several profiles, an overlay. Under torchrun every rank extracts, rank 0 reports.

    Args:
        reports: the targets (encoder checkpoints, models trained elsewhere) and their report folders;
        settings: the evaluation settings; out: the report folder (default ``<run>/eval``; one sub-folder per run).
    """
    layer = settings.layer
    check_eval_inputs(reports, settings, out)
    if settings.unused_options() and is_main_process():
        print(f"warning: --metric-option {', '.join(settings.unused_options())} set for a metric not in --evals "
              f"({', '.join(settings.evals)}): ignored; add it to --evals to run it")
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    env = dist_env.setup("cpu" if settings.device == "cpu" else "auto") if distributed else None
    profiles, done, diagnosed = {}, {}, {}
    for target, folder in reports.items():
        report = target.evaluate(settings, folder)
        if report is None:  # a non-zero torchrun rank: it only helped extract features
            continue
        name = "profile" if layer == "all" else "eval"
        _write_report(folder, name, report, layer)
        print(format_report(report))
        if layer == "all":
            profiles[report["label"]] = report["profile"]
        if "diagnostics" in report:
            diagnosed[report["label"]] = report["diagnostics"]
            png = plot_diagnostics({report["label"]: report["diagnostics"]}, folder / "diagnostics.png", eval_note(report))
            print(f"diagnostics: {png}")
        note = _bad_files_note(report)
        if note:
            print(note)
        hits = report["cache"]
        print(f"wrote {folder / (name + '.json')} (feature cache: train {'hit' if hits['train_hit'] else 'new'}, "
              f"test {'hit' if hits['test_hit'] else 'new'}, in {hits['dir']}{'' if hits['written'] else ', not written'})\n")
        done[target.name] = report
    if len(diagnosed) > 1:
        png = plot_diagnostics(diagnosed, Path(out or DEFAULT_OUT) / "diagnostics_overlay.png", eval_note(report))
        print(f"diagnostics overlay: {png}")
    if len(profiles) > 1:
        path = plot_profile(profiles, Path(out or DEFAULT_OUT) / "profile_overlay.png", note=_protocol_note(settings))
        print(f"overlay: {path}")
    if env is not None and dist.is_initialized():
        dist_env.cleanup(env)
    return done


def run_compare(runs: list[str], out: str, force: bool = False) -> dict:
    """Runs side by side: a table, ``compare.json`` and a bar PNG; unlike protocols are refused
    unless ``force``."""
    if len(runs) < 2:
        raise UserError("compare needs at least two runs or eval.json files")
    reports = [load_report(r) for r in runs]
    labels = [rep.get("label", Path(r).name) for rep, r in zip(reports, runs, strict=True)]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} [{i}]" for i, lab in enumerate(labels)]
    result = compare_reports(reports, labels, force=force)
    print(format_comparison(result, labels))
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compare.json").write_text(json.dumps({"runs": dict(zip(labels, [r["_source"] for r in reports], strict=True)), **result}, indent=2))
    png = plot_bars(result["rows"], folder / "compare.png",
                    "resdecay compare (* = protocols differ)" if result["differences"] else "resdecay compare")
    print(f"wrote {folder / 'compare.json'} and {png}")
    return result


def format_grid(r: dict) -> str:
    """The probe grid as a table, with its protocol line and the best cell."""
    p = r["protocol"]
    head = (f"diffusion probe grid | {p['checkpoint']} (step {p['step']}, {p['weights']} weights) | {p['data']} "
            f"train {p['train_images']} -> test {p['test_images']} | fast probe, mean tokens, null label")
    lines = [head, "block  " + "".join(f"{f'noise {lv:g}':>12}" for lv in r["levels"])]
    for layer, row in zip(r["layers"], r["top1"], strict=True):
        lines.append(f"{layer:>5}  " + "".join(f"{v:>12.4f}" for v in row))
    b = r["best"]
    lines.append(f"best cell: block {b['layer']}, noise level {b['level']:g}, top-1 {b['top1']:.4f}")
    return "\n".join(lines)


def run_eval_diffusion(checkpoint: str, data=None, out: str | None = None, layers: list[int] | None = None,
                       levels: tuple[float, ...] = NOISE_LEVELS, max_train: int | None = None,
                       max_test: int | None = None, device: str = "auto", batch_size: int = 256,
                       progress: bool = True) -> dict:
    """``resdecay eval-diffusion``: the probe grid of one checkpoint (EMA weights where kept).
    Every input is checked before the model is built or a feature extracted, so bad input
    costs a second, not an evaluation.

    Args:
        checkpoint: a U-ViT / SiT checkpoint; data: the data config (default: the run's);
        out: the output folder (default ``<run>/eval_diffusion``); layers: block indices (default all);
        levels: noise levels in [0, 1]; max_train, max_test: first N images of each split;
        device, batch_size, progress: as the CLI options.
    """
    for name, value in (("--batch-size", batch_size), ("--max-train", max_train), ("--max-test", max_test)):
        if value is not None and value < 1:
            raise UserError(f"{name} must be a positive integer, got {value}")
    check_levels(levels)
    dev = resolve_device(device, "--device")
    state = load_checkpoint(checkpoint)
    family = from_dict(state["config"]).model.family
    if not is_diffusion(family):
        raise UserError(f"{checkpoint} is a {family} model; eval-diffusion probes diffusion models "
                        "(uvit, sit); use `resdecay eval` for encoders")
    if data is not None:
        check_data_path(data.name, data.path)
    out_dir = check_writable(Path(out) if out else run_dir_of(Path(checkpoint)) / "eval_diffusion",
                             "pass --out DIR (a folder you can write)")
    model, cfg = load_model(checkpoint, dev, ema=True, state=state)
    data_cfg = replace(data or cfg.data, train_subset=None)
    train_set, _ = build_dataset(data_cfg, "train", cfg.model.img_size, augment=False)
    test_set, _ = build_dataset(data_cfg, "test", cfg.model.img_size, augment=False)
    train_set, test_set = (balanced_subset(ds, n, data_cfg.subset_seed) for ds, n in ((train_set, max_train), (test_set, max_test)))
    result = probe_grid(model, train_set, test_set, layers, levels, dev, batch_size, progress)
    step = int(state["train_state"]["step"])
    result["protocol"] = {"checkpoint": str(checkpoint), "step": step, "weights": "EMA" if cfg.train.ema_decay > 0 else "raw",
                          "data": data_cfg.name, "train_images": len(train_set), "test_images": len(test_set),
                          "subset": f"class-balanced, data.subset_seed={data_cfg.subset_seed}" if max_train or max_test else "none",
                          "feature": "mean of all tokens of the block output", "probe": FAST_RECIPE.card(),
                          "noise": f"{cfg.model.objective}: level = fraction of the diffusion time (0 clean, 1 pure noise), "
                                   "one seeded noise draw per image", "labels": "null label (no class leak)"}
    try:
        (out_dir / "probe_grid.json").write_text(json.dumps(result, indent=2))
        plot_grid(result, out_dir / "probe_grid.png", f"{cfg.preset} (alpha_min {cfg.model.alpha_min:g}), step {step}")
    except OSError as e:
        raise UserError(write_failure(out_dir / "probe_grid.json", e, "free some space or pass --out DIR")) from None
    result["paths"] = {"json": str(out_dir / "probe_grid.json"), "png": str(out_dir / "probe_grid.png")}
    return result


NATIVE_SIDE = {"digits": 8, "fashion-mnist": 28, "cifar10": 32, "cifar100": 32}


def pixel_side(data: DataConfig, img_size: int | None) -> int:
    """The side images are read at for the pixel baseline: --img-size, else the data set's own."""
    if img_size is not None:
        if img_size < 1:
            raise UserError(f"--img-size must be a positive integer, got {img_size}")
        return img_size
    if data.name == "fashion-mnist-m":
        return data.canvas
    if data.name not in NATIVE_SIDE:
        raise UserError(f"{data.name} images have no one size: pass --img-size N (the side your models read, e.g. 224)")
    return NATIVE_SIDE[data.name]


def run_pixel_baseline(data: DataConfig | None, settings: EvalSettings, img_size: int | None = None,
                       out: str | None = None) -> dict:
    """``resdecay eval --baseline pixels --data NAME``: every baseline metric on raw, normalised
    pixels, with the protocol ``settings`` gives, no checkpoint; rows cached per data set and
    protocol (``--cache-dir``, default ``baselines.default_baseline_cache()``, which ``ablate`` reads).

    Args:
        data: the data set (``--data``, ``--data-path``); settings: the evaluation settings
        (metrics, kNN / probe protocol, --max-train / --max-test); img_size: --img-size;
        out: the report folder (default runs/eval/pixels-<data>).
    """
    if data is None:
        raise UserError("--baseline pixels measures a data set, not a checkpoint: name it with --data NAME (and --data-path DIR)")
    if settings.layer != -1:
        raise UserError("--layer chooses an encoder block; raw pixels have none: drop --layer")
    settings.validate()
    check_data_path(data.name, data.path)
    if data.name in ("latents", "synthetic"):
        raise UserError(f"--baseline pixels measures images with labels; {data.name} has no pixels worth a baseline")
    side = pixel_side(data, img_size)
    folder = check_writable(Path(out or f"runs/eval/pixels-{data.name}"), "pass --out DIR (a folder you can write)")
    cache = settings.cache_dir or str(default_baseline_cache())
    rows, hit = evaluate_pixels(data, side, replace(settings, pixel_cache=cache))
    report = {"resdecay_eval": 1, "baseline": "pixels", "data": data.name, "img_size": side, "baselines": rows,
              "cache": hit}
    try:
        (folder / "pixels.json").write_text(json.dumps(report, indent=2))
    except OSError as e:
        raise UserError(write_failure(folder / "pixels.json", e, "free some space or pass --out DIR")) from None
    print(f"raw pixels | {data.name} at {side}x{side}, normalised as the models see them, no checkpoint")
    print(f"{'metric':<8} {'feature':<8} {'value':<32} protocol")
    for r in rows:
        print(f"{r['metric']:<8} {r['feature']:<8} {values_text(r):<32} {protocol_text(r)}")
    print(f"wrote {folder / 'pixels.json'} (pixel-baseline cache: {'hit' if hit['hit'] else 'new'}, {hit['file']})")
    return report


def eval_settings(args) -> EvalSettings:
    """``resdecay eval``'s parsed options as evaluation settings; a metric's own flags (``--k``) and
    ``--metric-option`` (which wins) both set its options."""
    data = None
    if args.data:  # --data-path alone: the checkpoint's data set at another path
        data = DataConfig(name=args.data, path=args.data_path, num_workers=args.num_workers, resize=args.resize)
    evals = tuple(e.strip() for e in args.evals.split(",") if e.strip()) if args.evals else metric_names(FEATURES)
    flags, given = flag_options(args.metric_flags), parse_assignments(args.metric_option)
    return EvalSettings(evals=evals, layer=args.layer, feature=args.feature, data=data, max_train=args.max_train,
                        max_test=args.max_test, batch_size=args.batch_size, num_workers=args.num_workers,
                        device=args.device, cache_dir=args.cache_dir, progress=not args.no_progress,
                        baselines=not args.no_baselines, data_path=None if args.data else args.data_path,
                        resize=args.resize, noise_level=args.noise_level,
                        metric_options={n: {**flags.get(n, {}), **given.get(n, {})} for n in [*flags, *given]})


def model_args(items: list[str]) -> dict:
    """``--model-arg KEY=VALUE`` (repeatable) as constructor arguments, each value read as a YAML scalar."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip().isidentifier():
            raise UserError(f"--model-arg {item!r} is not KEY=VALUE (e.g. --model-arg img_size=32)")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as e:
            problem = getattr(e, "problem", None) or one_line(e)
            raise UserError(f"--model-arg {item!r}: {value!r} is not a YAML value ({problem}); write a number, a "
                            f"list as [4, 4], or quote a string: {key.strip()}='\"...\"'") from None
    return out


def eval_command(args) -> None:
    """``resdecay eval``: the parsed options as evaluation settings, then the checkpoints measured, or
    (``--baseline pixels``) the raw pixels of a data set alone."""
    settings = eval_settings(args)
    data = settings.data
    if args.baseline:  # raw pixels alone: no checkpoint
        if args.checkpoints:
            raise UserError(f"--baseline pixels measures no checkpoint: drop {args.checkpoints[0]}, or drop --baseline "
                            "(pixels are measured beside every checkpoint anyway)")
        run_pixel_baseline(data, settings, args.img_size, args.out)
        return
    targets: list[Target] = [CheckpointTarget(Path(c)) for c in args.checkpoints]
    if args.model:  # a model trained elsewhere: built, its weights loaded, measured like a checkpoint
        targets.append(ForeignTarget(load_foreign(args.model, args.weights, model_args(args.model_arg),
                                                   trust_remote_code=args.trust_remote_code)))
    elif args.weights or args.model_arg or args.trust_remote_code:
        raise UserError("--weights, --model-arg and --trust-remote-code describe a --model SPEC (e.g. --model timm:vit_small_patch16_224); add it")
    if not targets:
        raise UserError("eval needs checkpoint files (<run>/checkpoints/step_*.pt), --model SPEC, or --baseline pixels --data NAME")
    if args.img_size is not None:
        raise UserError("--img-size applies to --baseline pixels; a checkpoint's images are read at its model.img_size")
    if args.export_row and Path(args.export_row).exists():
        raise UserError(f"--export-row {args.export_row} exists; name a new file (a row is never overwritten silently)")
    done = run_eval(targets, settings, args.out)
    if args.export_row and done:
        command = " ".join(["resdecay", *map(shlex.quote, map(str, args.argv))])
        print(f"leaderboard rows: {export_rows(list(done.values()), args.export_row, command)}")


def eval_diffusion_command(checkpoint: str, data: str | None, data_path: str | None, out: str | None, layers: str,
                           levels: str, max_train: int | None = None, max_test: int | None = None, device: str = "auto",
                           batch_size: int = 256, progress: bool = True) -> None:
    """``resdecay eval-diffusion``: ``--layers`` and ``--noise-levels`` parsed, the probe grid measured,
    the grid printed.

    Args:
        checkpoint: the diffusion checkpoint; data, data_path: ``--data`` / ``--data-path``;
        layers: 'all' or comma-separated block indices; levels: comma-separated noise levels;
        out, max_train, max_test, device, batch_size, progress: as ``run_eval_diffusion``.
    """
    try:
        blocks = None if layers == "all" else [int(v) for v in layers.split(",")]
    except ValueError:
        raise UserError(f"--layers takes 'all' or comma-separated block indices, e.g. 0,3,6; got {layers!r}") from None
    r = run_eval_diffusion(checkpoint, data=data_config(data, data_path, "symmetric"), out=out, layers=blocks,
                           levels=noise_levels(levels), max_train=max_train, max_test=max_test,
                           device=device, batch_size=batch_size, progress=progress)
    print(format_grid(r))
    print(f"wrote {r['paths']['json']} and {r['paths']['png']}")
