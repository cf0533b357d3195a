"""The ``diagnostics`` input kind: ``diagnose`` run once on the evaluation's data, one input per block.

``resdecay eval CKPT --evals diagnostics`` (or ``--model timm:NAME --weights FILE --data NAME``) draws a
class-balanced subset of each split (``diagnostics.images`` test images, ``diagnostics.train_images``
train images: the pixel ridge is fitted and the kNN bank built on the latter), runs the four diagnostics
and hands the metric one ``DiagnosticsLayer`` per block. The whole report (every part's share, each
sub-block's norms, the embedding's pixel R^2) goes into ``eval.json`` under ``"diagnostics"``, where the
command draws its PNG from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...data.resumable import check_first_sample
from ...data.subsets import balanced_subset
from ...errors import UserError
from ...stream.foreign import stream_model
from ..inputs import eval_split
from ..sources import Evaluation, Prepared, Source
from . import diagnose

DIAGNOSTICS = "diagnostics"  # the input kind


@dataclass
class DiagnosticsOptions:
    """The ``diagnostics`` metric's options (``--metric-option diagnostics.KEY=VALUE``).

    Args:
        images: test images measured (class-balanced subset, ``data.subset_seed``).
        train_images: train images the pixel ridge is fitted on and the kNN bank is built from.
        knockout_images: images of each split the knock-out runs on (each block costs ~half a forward each).
        pixel_patches: patches per image in the pixel ridge (0: all).
        ridge: the ridge's relative penalty (``pixels.default_lambda``).
    """

    images: int = 1000
    train_images: int = 1000
    knockout_images: int = 256
    pixel_patches: int = 64
    ridge: float = 1e-3

    def validate(self) -> None:
        """One line naming the option (and its flag) whose value cannot work."""
        for key, flag, low in (("images", "--diag-images", 2), ("train_images", "--diag-train-images", 1),
                               ("knockout_images", "--knockout-images", 1), ("pixel_patches", "", 0)):
            if getattr(self, key) < low:
                name = f"{flag} (diagnostics.{key})" if flag else f"diagnostics.{key}"
                raise UserError(f"{name} must be at least {low}, got {getattr(self, key)}"
                                + (" (0: every patch)" if key == "pixel_patches" else ""))
        if not self.ridge > 0:
            raise UserError(f"diagnostics.ridge must be a positive penalty (e.g. 1e-3), got {self.ridge}")


@dataclass
class DiagnosticsLayer:
    """What the metric reads for one block: its per-layer numbers (``per_layer``)."""

    values: dict


def _mean(values: list) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def per_layer(report: dict) -> list[dict]:
    """One dict per block output l (0..L-1) from a ``diagnose`` report: the direct path's share of the stream
    (projection, and of its variance across images), the pixel and high-frequency R^2 of its tokens, the mean
    shortcut/branch ratio and cosine of its sub-blocks, and the change / kNN loss when its branch is removed."""
    paths, pixels, branches, knock = (report.get(k) for k in ("paths", "pixels", "branches", "knockout"))
    subs = [len(a) for a in report["alphas"]]
    rows, k = [], 0
    for i in range(len(report["blocks"])):
        row: dict = {}
        if paths is not None:
            row.update(direct_share=paths["direct_projection"][i], direct_share_centred=paths["direct_projection_centred"][i],
                       direct_energy=paths["direct_energy"][i])
        if pixels is not None:
            row.update(pixel_r2=pixels["r2_pixels"][i + 1], high_freq_r2=pixels["r2_high_freq"][i + 1])
        if branches is not None:
            row.update(shortcut_ratio=_mean(branches["ratio"][k:k + subs[i]]),
                       branch_cosine=_mean(branches["cosine"][k:k + subs[i]]))
        if knock is not None:
            row["knockout_change"] = knock["change_pooled"][i]
            if "knn_top1" in knock:
                row["knockout_knn_drop"] = knock["knn_top1_intact"] - knock["knn_top1"][i]
        k += subs[i]
        rows.append({key: v for key, v in row.items() if v is not None})
    return rows


def diagnose_data(model, data, img_size: int, o: DiagnosticsOptions | None = None, pool: str = "mean",
                  conditioning: tuple = (), batch_size: int = 64, in_chans: int | None = None) -> tuple[dict, int, int]:
    """``diagnose`` on a data set: ``o.images`` test and ``o.train_images`` train images, class-balanced
    (``data.subset_seed``), no augmentation. Returns (report, test images, train images).

    Args:
        model: the network (``stream.foreign.stream_model``: a model trained elsewhere as its library's own).
        data: the ``DataConfig``; img_size: the side the model reads; o: the diagnostics' options;
        pool: the knock-out's pooling; o default: ``DiagnosticsOptions()``; conditioning: a diffusion backbone's fixed inputs; batch_size: per forward.
        in_chans: the channels the model takes, checked on the first image (None: not checked).
    """
    o = o or DiagnosticsOptions()
    o.validate()
    train = balanced_subset(eval_split(data, "train", img_size), o.train_images, data.subset_seed)
    test = balanced_subset(eval_split(data, "test", img_size), o.images, data.subset_seed)
    if in_chans is not None:  # one line (the target names the fix), not the model's own error at the first conv
        check_first_sample(test, in_chans, img_size, data.name)
    report = diagnose(model, test, train_images=train, conditioning=conditioning, batch_size=batch_size, ridge=o.ridge,
                      pixel_patches=o.pixel_patches or None, knockout_images=o.knockout_images, pool=pool)
    return report, len(test), len(train)


def _check(ev: Evaluation, metrics: list) -> None:
    ev.settings.metric_settings().options_of(DIAGNOSTICS).validate()  # before any image is read


def _prepare(ev: Evaluation, metrics: list):
    o = ev.settings.metric_settings().options_of(DIAGNOSTICS)
    model, conditioning = stream_model(ev.model)
    report, n_test, n_train = diagnose_data(model, ev.data, ev.img_size, o, ev.settings.feature, conditioning,
                                            min(ev.settings.batch_size, 64), ev.model.cfg.in_chans)
    card = {"train": {"data": ev.data.name, "images": n_train}, "test": {"data": ev.data.name, "images": n_test},
            "test_images": n_test, "train_images": n_train, "checkpoint_sha256": ev.sha, "diagnostics": asdict(o),
            "pool": ev.settings.feature, "pixel_r2_embedding": report["pixels"]["r2_pixels"][0],
            "high_freq_r2_embedding": report["pixels"]["r2_high_freq"][0]}
    report["protocol"] = {"data": ev.data.name, "subset_seed": ev.data.subset_seed}  # the figure's caption reads it
    ev.notes["diagnostics"] = report
    for layer, values in enumerate(per_layer(report)):
        yield Prepared(layer, DiagnosticsLayer(values), card)


SOURCES = (Source(DIAGNOSTICS, prepare=_prepare, check=_check, every_rank=False),)  # registered by eval/__init__.py
