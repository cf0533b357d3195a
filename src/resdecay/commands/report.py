"""``resdecay plot`` (Figures 4 and 5c from logged values) and ``resdecay figures`` (t-SNE, PCA
feature maps and reconstructions of several checkpoints side by side, Figures 3 and 6)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import torch

from ..data import DataConfig, build_dataset
from ..errors import UserError
from ..eval.inputs import check_data_path
from ..eval.metrics import column_title, get_metric
from ..io import run_dir_of
from ..nn.shortcut_info import describe_model
from ..train.checkpoint import load_model
from ..train.config import shortcut_tag
from ..train.log.runlog import read_log
from ..viz.diagnostics_figures import FIGURE_OPTIONS, diagnose_and_plot
from ..viz.figures import (
    diffusion_keys,
    online_rows,
    plot_correlation,
    plot_diffusion_curves,
    plot_pca_maps,
    plot_rank_and_accuracy,
    plot_tsne,
)
from ..viz.plots import plot_reconstructions, reconstruct
from .options import block_index, seg_protocol
from .segment_figures import run_segmentation_figures


def run_label(run: Path) -> str:
    summary = run / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        return f"{run.name} ({s.get('shortcut_label') or shortcut_tag(s['alpha_min'], s.get('skips'))})"  # older: no formula
    return run.name


def run_plot(runs: list[str], out: str, accuracy: str = "probe") -> dict:
    """Figure 4 (effective rank and accuracy over epochs) and Figure 5c (their correlation); for
    diffusion runs, proxy FID and the best probe cell over epochs."""
    logs = {}
    for r in runs:
        path = Path(r)
        rows = online_rows(read_log(path))
        if not rows:
            raise UserError(f"{path}: log.jsonl has no online evaluations; pretrain with train.online_eval_every=N")
        logs[run_label(path)] = rows
    out_dir = Path(out)
    fid_key, *other_keys = diffusion_keys()
    if any(fid_key in r for rows in logs.values() for r in rows):  # diffusion runs: FID and probe curves
        curves = plot_diffusion_curves(logs, out_dir / "fid_and_probe.png")
        report = {"diffusion_curves": curves, "runs": dict(zip(logs, runs, strict=False))}
        (out_dir / "plot.json").write_text(json.dumps(report, indent=2, default=str))
        for label, rows in logs.items():
            last = [r for r in rows if fid_key in r]
            if last:
                r = last[-1]
                rest = "".join(f", {column_title(k)} {r.get(k, float('nan')):.4f}" for k in other_keys)
                print(f"{label}: epoch {r.get('epoch', '?'):g}: {column_title(fid_key)} {r[fid_key]:.3f}{rest}")
        print(f"wrote {out_dir / 'fid_and_probe.png'}, {out_dir / 'plot.json'}")
        return report
    acc_key = f"online_{get_metric(accuracy).display.key}"  # the accuracy metric's logged column (probe_top1, knn_top1)
    fig4 = plot_rank_and_accuracy(logs, out_dir / "rank_and_accuracy.png", accuracy_key=acc_key)
    fig5 = plot_correlation(logs, out_dir / "rank_accuracy_correlation.png", accuracy_key=acc_key)
    report = {"figure4": fig4, "figure5c": fig5, "runs": dict(zip(logs, runs, strict=False))}
    (out_dir / "plot.json").write_text(json.dumps(report, indent=2, default=str))
    for label, c in fig5.items():
        r = c.get("pearson_r")
        print(f"{label}: Pearson r(rank, {accuracy}) = {r:.3f} over {c['n']} evaluations" if r is not None else f"{label}: {c.get('note')}")
    print(f"wrote {out_dir / 'rank_and_accuracy.png'}, {out_dir / 'rank_accuracy_correlation.png'}, {out_dir / 'plot.json'}")
    return report


def run_figures(checkpoints: list[str], out: str, data: DataConfig | None = None, per_class: int = 50,
                images: int = 8, layer: int = -1, seed: int = 0, data_path: str | None = None) -> dict:
    """t-SNE of the same balanced subset, PCA maps of patch features, masked reconstructions and the
    residual-stream diagnostics (``diagnostics.png``, the models overlaid).

    Args:
        checkpoints: encoder checkpoints, drawn side by side; out: the output folder;
        data: the images (default: the first checkpoint's data set, read from ``data_path`` if given);
        per_class, images, layer, seed: t-SNE points per class, reconstructions, block, seed.
    """
    if data is not None:  # a folder beside a data set that reads none is refused, not silently ignored
        check_data_path(data.name, data.path)
    models, cfgs = {}, {}
    for c in checkpoints:
        model, cfg = load_model(c)
        label = f"{run_dir_of(Path(c)).name} ({describe_model(cfg.model)})"
        models[label], cfgs[label] = model, cfg
    first = next(iter(cfgs.values()))
    sizes = {(cfg.model.img_size, cfg.model.in_chans) for cfg in cfgs.values()}
    if len(sizes) > 1:
        raise UserError(f"the checkpoints take different inputs {sorted(sizes)}; figures need one image size and channel count")
    if data is None:
        check_data_path(first.data.name, data_path)
        data = replace(first.data, augment="none", train_subset=None, path=data_path or first.data.path)
    test, info = build_dataset(data, "test", first.model.img_size, augment=False)
    out_dir = Path(out)
    cards = {"tsne": plot_tsne(models, test, out_dir / "tsne.png", classes=min(10, info.num_classes),
                               per_class=per_class, layer=layer, seed=seed)}
    batch = torch.stack([test[i][0] for i in range(min(images, len(test)))])
    cards["pca_maps"] = plot_pca_maps(models, batch, info.mean, info.std, out_dir / "pca_maps.png", layer=layer, seed=seed)
    if all(hasattr(m, "forward_decoder") for m in models.values()):
        rows = {"original": batch}
        for label, model in models.items():
            masked, recon = reconstruct(model, batch, seed=seed)
            rows.setdefault("masked", masked)
            rows[label] = recon
        note = "removed patches: norm-pix predictions un-normalised with the visible patches' mean/std; same mask for all models"
        plot_reconstructions(batch, rows, info.mean, info.std, out_dir / "reconstructions.png", note)
        cards["reconstructions"] = {"figure": "reconstructions", "images": len(batch), "mask_seed": seed, "note": note,
                                    "path": str(out_dir / "reconstructions.png")}
    png, diagnosed = diagnose_and_plot(models, data, first.model.img_size, out_dir / "diagnostics.png")
    cards["diagnostics"] = {"figure": "diagnostics", "path": str(png), "options": asdict(FIGURE_OPTIONS),
                            "last_block": {label: d["summary"] for label, d in diagnosed.items()}}
    (out_dir / "figures.json").write_text(json.dumps(cards, indent=2, default=str))
    print(f"wrote {', '.join(Path(c['path']).name for c in cards.values())} and figures.json in {out_dir}")
    return cards


def figures_command(args) -> None:
    """``resdecay figures``: t-SNE, PCA maps and reconstructions of the checkpoints side by side, or
    (``--segmentation``) their segmentation figures."""
    data = DataConfig(name=args.data, path=args.data_path) if args.data else None
    if args.segmentation:
        protocol = seg_protocol(args)
        run_segmentation_figures(args.checkpoints, args.out, protocol, data, protocol.data, protocol.path,
                                 images=args.images, layer=block_index(args.layer, "--layer"))
        return
    run_figures(args.checkpoints, args.out, data, per_class=args.per_class, images=args.images,
                layer=block_index(args.layer, "--layer"), seed=args.seed, data_path=None if args.data else args.data_path)
