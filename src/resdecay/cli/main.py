"""``resdecay`` command line: the parsers of demo, alpha, pretrain, finetune, train-supervised, eval, compare,
plot, figures, ablate, presets and the rest, each dispatching to its command in ``resdecay.commands``.

Errors a user can fix print one line and exit with code 2; a diverged run exits with 3.
Under torchrun use the module form: ``torchrun --nproc_per_node 8 -m resdecay pretrain ...``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .._version import __version__
from ..commands.ablate_seeds import run_ablate
from ..commands.check_data import run_check_data
from ..commands.demos import run_demo_command
from ..commands.evaluate import eval_command, run_compare
from ..commands.finetune import run_finetune
from ..commands.presets import print_presets
from ..commands.pretrain import run_pretrain
from ..commands.report import figures_command, run_plot
from ..commands.supervised import run_supervised
from ..errors import TrainingDiverged, UserError, one_line
from ..eval.metrics import FEATURES, get_metric, metric_names, registered
from .alpha import add_alpha_command
from .checkpoint import add_checkpoint_command
from .diffusion import add_commands as add_diffusion_commands
from .eval_classifier import add_eval_classifier_command
from .examples import add_examples
from .interop import add_interop_commands
from .metric_flags import add_metric_flags
from .parents import data_options, device_option, progress_option, run_folder_options, run_overrides, source_options
from .plugins import ENV as PLUGIN_ENV
from .plugins import load_plugins
from .shard import add_shard_command
from .submit import add_submit_command


def cmd_pretrain(args) -> None:
    run_pretrain(args.preset, run_overrides(args), resume=args.resume, print_config=args.print_config,
                 progress=not args.no_progress, check=args.check_data, overwrite=args.overwrite,
                 allow_changes=args.allow_changes, source=args.source, fmt=args.format,
                 import_preset=args.import_preset, alpha_min=args.alpha_min, import_overrides=args.import_override)


def finetune_source(positional: str | None, option: str | None, overrides: list[str]) -> tuple[str, list[str]]:
    """The pretrained model named as ``finetune FILE`` or ``finetune --from FILE``, and the overrides.
    argparse hands ``finetune --from X epochs=3`` its first key=value as the positional: an override."""
    if positional is not None and option is not None:
        if "=" in positional and not Path(positional).exists():
            return option, [positional, *overrides]
        raise UserError(f"give the pretrained model once: --from {option} or {positional}, not both")
    if positional is None and option is None:
        raise UserError("finetune needs the pretrained model: resdecay finetune --from FILE (a checkpoint, run folder or "
                        "ViTMAE folder) [--preset finetune-mae|linprobe-mae]")
    return option or positional, overrides


def cmd_finetune(args) -> None:
    source, overrides = finetune_source(args.checkpoint, args.source, run_overrides(args))
    run_finetune(source, args.preset, overrides, resume=args.resume, progress=not args.no_progress,
                 overwrite=args.overwrite, allow_changes=args.allow_changes, fmt=args.format,
                 import_preset=args.import_preset, alpha_min=args.alpha_min, import_overrides=args.import_override)


def cmd_supervised(args) -> None:
    run_supervised(args.preset, run_overrides(args), resume=args.resume, progress=not args.no_progress,
                   overwrite=args.overwrite, allow_changes=args.allow_changes)


def add_demo_command(sub) -> None:
    """demo: a plain and a decayed model trained side by side on small data and compared."""
    d = sub.add_parser("demo", parents=[progress_option()], help="pretrain a plain and a decayed U-Net MAE (or, --diffusion, U-ViT) on small data and compare them")
    d.add_argument("--diffusion", action="store_true", help="train tiny U-ViTs instead; report proxy FID and the probe grid")
    d.add_argument("--data", default="auto", help="auto (Fashion-MNIST if its IDX files are installed, else digits), digits, fashion-mnist, "
                   "fashion-mnist-m (garments on photographs, where the decay wins: RESULTS §14's cell, 32 epochs, the two models "
                   "side by side, one core each; about 12 minutes on 2 cores)")
    d.add_argument("--out", default=None, help="output folder (default runs/demo, runs/demo_diffusion with --diffusion)")
    d.add_argument("--epochs", type=int, default=None, help="override the demo's epochs for both models")
    d.add_argument("--alpha-min", type=float, default=None, help="alpha_min of the decayed model (default 0.6; 0.8 on fashion-mnist-m; 0.7 with --diffusion)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--samples", type=int, default=None, help="with --diffusion: images sampled per model for the proxy FID "
                   "(default 1000 on fashion-mnist, 500 on digits; at least 129)")
    d.add_argument("--max-images", type=int, default=None, help="with --diffusion: cap the training images and the probe "
                   "grid's train/test images (a quick run)")
    d.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's, i.e. the cores); "
                   "the decayed model's exact numbers depend on it (docs/reproducing.md, 'What the numbers depend on')")
    d.set_defaults(func=lambda a: run_demo_command(a.diffusion, a.data, a.out, a.epochs, a.alpha_min, a.seed,
                                                   progress=not a.no_progress, threads=a.threads, samples=a.samples,
                                                   max_images=a.max_images))


def add_ablate_command(sub) -> None:
    """ablate: a grid of variants trained and measured alike, once or once per seed."""
    ab = sub.add_parser("ablate", parents=[progress_option()], help="run a grid of variants fairly (same seed, init, data order, budget) and compare")
    ab.add_argument("--grid", default=None, help="shipped grid name (--list) or a YAML file")
    ab.add_argument("--list", action="store_true", help="list the shipped grids")
    ab.add_argument("--only", default=None, help="comma list of variant names to run now")
    ab.add_argument("--out", default=None, help="output folder (default runs/ablate/<grid>)")
    ab.add_argument("--seeds", default=None, metavar="0,1,2",
                    help="run the grid once per seed into <out>/seed<N> (as --out <out>/seed<N> train.seed=<N>), "
                         "then write mean ± std over the seeds to <out>")
    ab.add_argument("overrides", nargs="*", metavar="key=value",
                    help="added to every variant, e.g. data.path=/data/in100; eval.KEY=VALUE sets the grid's evaluation, "
                         "e.g. eval.num_workers=2")
    ab.set_defaults(func=lambda a: run_ablate(a.grid, a.out, only=a.only, seeds=a.seeds, extra=a.overrides,
                                              progress=not a.no_progress, list_only=a.list))


def add_measurement_commands(sub) -> None:
    """eval, compare, plot, figures: the commands that measure and draw trained runs."""
    e = sub.add_parser("eval", parents=[data_options("dataset (default: the checkpoint's training data)"), device_option(), progress_option()], help="kNN, linear probe and effective rank of checkpoints (features cached)")
    e.add_argument("checkpoints", nargs="*", help="checkpoint files (<run>/checkpoints/step_*.pt)")
    e.add_argument("--model", default=None, metavar="SPEC",
                   help="a model trained elsewhere: timm:NAME or torchvision:NAME (with --weights FILE), or a "
                        "transformers / diffusers save_pretrained folder; needs --data")
    e.add_argument("--weights", default=None, metavar="FILE",
                   help="--model timm:/torchvision: its weights (state_dict, checkpoint, safetensors or a "
                        "save_decayified file); default: random weights")
    e.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="--model: a constructor argument (repeatable), e.g. img_size=32, in_chans=1; timestep / "
                        "class_label: a diffusion backbone's fixed conditioning (diffusers default 500 / 0)")
    e.add_argument("--trust-remote-code", action="store_true",
                   help="--model FOLDER: run the Python file its config.json's auto_map names (transformers' own "
                        "opt-in; the file runs with your permissions: read it first)")
    e.add_argument("--baseline", choices=("pixels",), default=None,
                   help="pixels: the raw-pixel baseline of --data alone, no checkpoint (cached per data set and protocol)")
    e.add_argument("--img-size", type=int, default=None, help="with --baseline pixels: image side (default: the data set's own)")
    e.add_argument("--resize", action="store_true",
                   help="read fixed-size images (digits, Fashion-MNIST, CIFAR) resized to the model's input side "
                        "instead of refusing a size that differs (recorded in the protocol card)")
    e.add_argument("--layer", default="-1", help="encoder block index (-1 = last) or 'all' for the per-layer profile")
    e.add_argument("--noise-level", type=float, default=None, metavar="L",
                   help="a diffusion checkpoint (uvit, sit): its blocks' tokens at this fraction of the diffusion time "
                        "(0 clean, 1 pure noise; null label, EMA weights), measured by every metric as an encoder's")
    e.add_argument("--feature", default="mean", help="pooling: mean (all tokens incl. cls; default) | cls | patch_mean")
    e.add_argument("--evals", default=None, help=f"comma list of {', '.join(metric_names(FEATURES))} (default: all; "
                                                  "the registered metrics, a --plugin's included)")
    e.add_argument("--metric-option", action="append", default=[], metavar="NAME.KEY=VALUE",
                   help="a metric's own option, e.g. knn.k=10, segmentation.solver=kmeans (repeatable; wins over "
                        "--k, --temperature, --probe-*, --rank-exp and --seg-*, which set knn.*, probe.*, rank.exp, "
                        "segmentation.*)")
    e.add_argument("--max-train", type=int, default=None, help="use N training images (class-balanced, seeded by data.subset_seed)")
    e.add_argument("--max-test", type=int, default=None, help="use N test images (class-balanced, seeded by data.subset_seed)")
    e.add_argument("--batch-size", type=int, default=256)
    e.add_argument("--num-workers", type=int, default=0)
    e.add_argument("--cache-dir", default=None, help="feature cache (default <run>/eval/cache; --baseline pixels: "
                                                      "~/.cache/resdecay/baselines)")
    e.add_argument("--out", default=None, help="output folder (default <run>/eval)")
    add_metric_flags(e, registered(where="eval"))  # --k, --probe-epochs, --seg-*, ...: each metric's own
    e.add_argument("--export-row", default=None, metavar="FILE.csv",
                   help="also write each model's kNN / linear / EP numbers as a row of efficient-probing's results.csv "
                        "(the leaderboard's layout), with this command")
    e.add_argument("--no-baselines", action="store_true",
                   help="skip the raw-pixel and random-init-encoder rows (measured by default with the same protocol)")
    e.set_defaults(func=eval_command)

    c = sub.add_parser("compare", help="runs side by side (table + bar PNG), refusing unlike protocols")
    c.add_argument("runs", nargs="+", help="run folders (with eval/eval.json) or eval.json files")
    c.add_argument("--force", action="store_true", help="show numbers with different protocols, marked")
    c.add_argument("--out", default="runs/compare", help="output folder (default runs/compare)")
    c.set_defaults(func=lambda a: run_compare(a.runs, a.out, force=a.force))

    pl = sub.add_parser("plot", help="Figure 4 and 5c from runs' logged online evaluations (rank, accuracy over epochs); "
                                          "for diffusion runs, proxy FID and best probe cell over epochs")
    pl.add_argument("runs", nargs="+", help="run folders pretrained with train.online_eval_every=N")
    pl.add_argument("--accuracy", default="probe", choices=["probe", "knn"], help="which logged accuracy to plot")
    pl.add_argument("--out", default="runs/plot", help="output folder (default runs/plot)")
    pl.set_defaults(func=lambda a: run_plot(a.runs, a.out, a.accuracy))

    fg = sub.add_parser("figures", parents=[data_options("dataset (default: the first checkpoint's)")], help="t-SNE, PCA feature maps and reconstructions of checkpoints side by side")
    fg.add_argument("checkpoints", nargs="+", help="checkpoints to show side by side (e.g. plain and decayed)")
    fg.add_argument("--layer", default="-1", help="encoder block for t-SNE and PCA maps (default -1, the last)")
    fg.add_argument("--per-class", type=int, default=30, help="t-SNE images per class (first 10 classes)")
    fg.add_argument("--images", type=int, default=8, help="images in the PCA and reconstruction grids")
    fg.add_argument("--seed", type=int, default=0)
    fg.add_argument("--out", default="runs/figures", help="output folder (default runs/figures)")
    fg.add_argument("--segmentation", action="store_true",
                    help="instead: the segmentation figures (spectral_rgb.png, segmentation.png) with the --seg-* protocol")
    add_metric_flags(fg, [get_metric("segmentation")])
    fg.set_defaults(func=figures_command)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="resdecay", description="Decayed identity shortcuts: x <- alpha*x + f(x), alpha falling with depth.")
    p.add_argument("--version", action="version", version=f"resdecay {__version__}")
    p.add_argument("--plugin", action="append", default=[], metavar="FILE.py",
                   help=f"import a file that registers a shortcut formula, model family or metric (repeatable; "
                        f"or {PLUGIN_ENV}=a.py{os.pathsep}b.py); docs/EXTENDING.md")
    sub = p.add_subparsers(dest="command", required=True)

    add_demo_command(sub)

    add_alpha_command(sub)  # cli/alpha.py

    t = sub.add_parser("pretrain", help="pretrain a preset on CPU, one GPU or many (torchrun)", parents=[
        progress_option(), run_folder_options(), source_options(
            "continue pretraining a pretrained MAE, encoder and decoder, as a fresh run of --preset (the sources of "
            "finetune --from: a resdecay MAE checkpoint or run folder, an official facebookresearch/mae or U-Net MAE "
            ".pth, a Hugging Face ViTMAE folder; docs/training.md)",
            "for an imported model: the MAE preset for what its weights do not say (default: --preset)")])
    t.add_argument("--preset", required=True, help="preset name (resdecay presets) or a YAML file")
    t.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    t.add_argument("--check-data", action="store_true",
                   help="decode every image first and list every unreadable file (stops unless data.on_bad_file=skip)")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. alpha_min=0.7 train.epochs=100 data.path=/data/in100")
    t.set_defaults(func=cmd_pretrain)

    f = sub.add_parser("finetune", help="MAE fine-tuning or linear probing (LARS) of a pretrained checkpoint", parents=[
        progress_option(), run_folder_options("auto or a checkpoint path of this fine-tuning run"), source_options(
            "the pretrained model: a resdecay MAE checkpoint or run folder, an official facebookresearch/mae or "
            "U-Net MAE .pth, a timm ViT, or a Hugging Face ViTMAE folder (imported in this step)",
            "for an imported model: the MAE preset for what its weights do not say (heads, data), as import-weights "
            "--preset; e.g. mae-b16-plain")])
    f.add_argument("checkpoint", nargs="?", default=None, help="the pretrained model (the same as --from)")
    f.add_argument("--preset", default="finetune-mae", help="finetune-mae (default) or linprobe-mae")
    f.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. train.epochs=10 drop_path=0.2")
    f.set_defaults(func=cmd_finetune)

    sv = sub.add_parser("train-supervised", parents=[progress_option(), run_folder_options()],
                        help="supervised ResNet with decayed shortcuts (appendix B.2, Figure 7)")
    sv.add_argument("--preset", required=True, help="resnet18-cifar10 | resnet18-cifar100 | resnet18-fmnist | a YAML file")
    sv.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. alpha_min=0.7 model.layers=[2,2,16,2] data.path=/data")
    sv.set_defaults(func=cmd_supervised)

    add_ablate_command(sub)

    add_measurement_commands(sub)
    add_eval_classifier_command(sub, [data_options("dataset (default: the checkpoint's)"), device_option(), progress_option()])

    cd = sub.add_parser("check-data", parents=[data_options("dataset (default imagefolder with --data-path)"), progress_option()],
                        help="decode every image of a data set in parallel and list every unreadable file at once")
    cd.add_argument("--preset", default=None, help="check the data set of this preset (with key=value overrides)")
    cd.add_argument("--workers", type=int, default=None, help="decoding threads (default 2 x CPU cores, at most 64)")
    cd.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. data.path=/data/imagenet")
    cd.set_defaults(func=lambda a: run_check_data(a.preset, a.overrides, a.data, a.data_path, workers=a.workers,
                                                  progress=not a.no_progress))

    add_shard_command(sub)  # cli/shard.py: an ImageFolder as tar shards (data.name=wds)

    add_checkpoint_command(sub)  # cli/checkpoint.py: a sharded (DCP) checkpoint as one file

    add_interop_commands(sub)

    add_diffusion_commands(sub)

    add_submit_command(sub, main)  # every task of a submitted job calls main

    s = sub.add_parser("presets", help="list the shipped presets")
    s.set_defaults(func=lambda a: print_presets())
    add_examples(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:  # before the parser: registered names (metrics, families, formulas) become choices
        load_plugins(argv)
    except UserError as e:
        print(f"resdecay: error: {one_line(e)}", file=sys.stderr)
        return 2
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may come after options (`finetune CKPT --preset x epochs=3`)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.argv = argv  # the command as given (eval --export-row writes it beside the numbers)
    try:
        args.func(args)
    except UserError as e:
        print(f"resdecay: error: {one_line(e)}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:
        print(f"resdecay: training stopped: {e}", file=sys.stderr)
        return 3
    except BrokenPipeError:  # `resdecay alpha ... | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("resdecay: interrupted; resume with --resume auto", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
