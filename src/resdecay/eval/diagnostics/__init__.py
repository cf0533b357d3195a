"""Residual-stream diagnostics: what the identity path carries, for any model whose blocks
``decayify``'s adapters reach (every row of docs/coverage.md: ViTs, staged models stage by stage, DiTs, U-Nets),
decayified or not (alpha = 1).

    from resdecay.eval.diagnostics import diagnose
    report = diagnose(model, test_images, train_images=train_images, labels=y_test, train_labels=y_train)
    report["paths"]["direct_projection"]      # per block: the share of the stream that is (prod alpha) x_0

Four measurements, one module each (their docstrings hold the formulas):

* ``paths``     exact decomposition of the stream into the direct path and every branch, per depth;
* ``pixels``    ridge R^2 of each patch's normalised pixels / their high frequencies from its token;
* ``branches``  ||alpha x||, ||f(x)||, their ratio and cosine per sub-block;
* ``knockout``  the change of the last layer, and its kNN, when one block's branch is set to zero.

Nothing changes in the model: forward hooks read it (``record``), and every hook is removed after.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Literal

import torch
import torch.nn as nn
from torch.utils.data import Dataset

from ...errors import UserError
from ...stream.record import Pass, hooked, in_run_order
from ...stream.runner import Forward, image_batches, model_runner
from ...stream.sites import Site, find_sites, patch_size_of
from ..protocol import KNN_K
from .branches import BranchStats
from .knockout import UNITS, KnockoutStats
from .paths import PathStats
from .pixels import PixelStats, layer_patch, ridge_r2

DIAGNOSTICS = ("paths", "pixels", "branches", "knockout")

__all__ = ["DIAGNOSTICS", "UNITS", "DiagnoseOptions", "diagnose", "find_sites", "ridge_r2"]


def _check_ran(sites: list[Site], rec: Pass) -> None:
    """Every block of the stream ran in the forward (and was read)."""
    for i, site in enumerate(sites):
        if rec.inputs.get(i) is None or rec.outputs.get(i) is None:
            raise UserError(f"diagnostics: block {site.name} did not run in the model's forward; pass forward= "
                            "a function that runs the stream's blocks, or container= the blocks that run")
        missing = [sub.name for j, sub in enumerate(site.subs) if (i, j) not in rec.branches]
        if missing:
            raise UserError(f"diagnostics: the branch of {', '.join(missing)} was not read where the adapter "
                            f"({site.kind}) says its adds are: a branch end that does not run in the forward")


def stages(sites: list[Site], rec: Pass) -> list[list[int]]:
    """The runs of blocks that carry one stream of one shape (the stages of a staged model; a plain ViT: one),
    each decomposed from its own first input: a block whose identity path is a projection, or whose output has
    another shape than its input (a ResNet stage's first block, a U-Net's skip fusion), belongs to none."""
    runs: list[list[int]] = []
    for i, site in enumerate(sites):
        shape = rec.inputs[i].shape
        if any(sub.role.identity is not None for sub in site.subs) or rec.outputs[i].shape != shape:
            runs.append([])
            continue
        if not runs or not runs[-1] or runs[-1][-1] != i - 1 or rec.outputs[i - 1].shape != shape:
            runs.append([])
        runs[-1].append(i)
    return [r for r in runs if r]


class _Run:
    """The accumulators of one ``diagnose`` call and the loop that feeds them, one batch at a time."""

    def __init__(self, model: nn.Module, sites: list[Site], which: tuple, opts: dict):
        self.model, self.sites, self.which, self.opts = model, sites, which, opts
        self.paths: list[tuple[list[int], PathStats]] | None = None  # per stage, from the first pass
        self.branches = BranchStats(sites) if "branches" in which else None
        self.knock = KnockoutStats(sites, opts["knockout"], opts["pool"]) if "knockout" in which else None
        self.pixels: PixelStats | None = None
        self.labels: dict[str, list[torch.Tensor]] = {"train": [], "test": []}
        self.shape: tuple | None = None
        self.count = {"train": 0, "test": 0}
        self.knocked = {"train": 0, "test": 0}  # images knocked out so far (knockout_images caps them)

    def _pixels(self, layers: list[torch.Tensor], rec: Pass, images: torch.Tensor) -> PixelStats:
        if self.pixels is None:
            given = self.opts["patch_size"]
            patch = given or patch_size_of(self.model)
            patch = (patch, patch) if isinstance(patch, int) else (tuple(patch) if patch is not None else None)
            hw = tuple(images.shape[-2:])
            per_layer = [layer_patch(t.shape, rec.grids.get(k), hw, patch, strict=given is not None and k == 0)
                         for k, t in enumerate(layers)]
            if not any(per_layer):
                raise UserError("diagnostics: the model's patch size is not recorded anywhere it looks; pass "
                                "patch_size=(h, w)")
            self.pixels = PixelStats(per_layer, self.opts["sigma"], self.opts["pixel_patches"], self.opts["seed"])
        return self.pixels

    def feed(self, split: str, source, labels: torch.Tensor | None, run, device, dtype) -> None:
        """Every batch of ``source``: one recorded pass, then each measurement that reads this split."""
        start, bs = 0, self.opts["batch_size"]
        for images, y in image_batches(source, bs):
            n = len(images)
            y = labels[start:start + n] if labels is not None else y
            if y is not None:
                self.labels[split].append(torch.as_tensor(y).cpu())
            images = images.to(device=device, dtype=dtype)
            rec = Pass()
            with hooked(self.sites, rec, on_pair=self.branches if split == "test" else None):
                run(images)
            _check_ran(self.sites, rec)
            self.shape = tuple(rec.inputs[0].shape[1:])
            self._measure(split, run, images, rec, start)
            start += n
            self.count[split] += n

    def _measure(self, split: str, run, images: torch.Tensor, rec: Pass, start: int) -> None:
        layers = [rec.inputs[0]] + [rec.outputs[i] for i in range(len(self.sites))]
        if "pixels" in self.which:
            pixels = self._pixels(layers, rec, images)
            if self.opts["split_test"]:  # no train images: even-numbered test images fit, odd ones score
                even = (torch.arange(start, start + len(images)) % 2 == 0).to(images.device)
                for part, keep in (("train", even), ("test", ~even)):
                    if bool(keep.any()):
                        pixels.update(part, [t[keep] for t in layers], images[keep])
            else:
                pixels.update(split, layers, images)
        if split == "test" and "paths" in self.which:
            if self.paths is None:
                self.paths = [(run_, PathStats([self.sites[i] for i in run_])) for run_ in stages(self.sites, rec)]
            for run_, stats in self.paths:
                stats.update(rec.restricted(run_))
        cap = self.opts["knockout_images"]
        if self.knock is not None and (split == "test" or self.opts["knn"]) and (cap is None or self.knocked[split] < cap):
            self.knock.update(split, run, images, rec, measure=split == "test")
            self.knocked[split] += len(images)

    def _paths_report(self) -> dict:
        """One stream: the decomposition as ``PathStats`` gives it. A staged one: each stage's under ``stages``,
        and per block (depth 1..L) its stage's direct path and reconstruction error (None for a block in none)."""
        n = len(self.sites)
        if len(self.paths) == 1 and self.paths[0][0] == list(range(n)):
            return self.paths[0][1].summary()
        out: dict = {"depth": list(range(1, n + 1)), "stages": []}
        keys = ("alpha_product", "reconstruction_error", "direct_energy", "direct_projection", "direct_energy_centred",
                "direct_projection_centred")
        for key in keys:
            out[key] = [None] * n
        for run_, stats in self.paths:
            summary = stats.summary()
            out["stages"].append({"blocks": [self.sites[i].name for i in run_], **summary})
            for key in keys:
                for i, value in zip(run_, summary[key], strict=True):
                    out[key][i] = value
        return out

    def report(self) -> dict:
        sites = self.sites
        out: dict = {"model": type(self.model).__name__, "blocks": [s.name for s in sites],
                     "kinds": sorted({s.kind for s in sites}),
                     "sub_blocks": [sub.name for s in sites for sub in s.subs],
                     "alphas": [[sub.alpha for sub in s.subs] for s in sites],
                     "images": self.count["test"], "train_images": self.count["train"],
                     "tokens": self.shape[0], "width": self.shape[-1]}
        if self.paths is not None:
            out["paths"] = self._paths_report()
        if self.pixels is not None:
            out["pixels"] = self.pixels.summary(self.opts["ridge"])
            out["pixels"]["split"] = "even/odd test images" if self.opts["split_test"] else "train/test images"
        if self.branches is not None:
            out["branches"] = self.branches.summary()
        if self.knock is not None:
            lab = {s: torch.cat(v)[:self.knocked[s]] if v else None for s, v in self.labels.items()}
            knn = self.opts["knn"] and lab["train"] is not None and lab["test"] is not None
            out["knockout"] = self.knock.summary(lab["train"] if knn else None, lab["test"] if knn else None,
                                                 self.opts["knn_k"])
            out["knockout"].update(images=self.knocked["test"], train_images=self.knocked["train"])
        return out


@dataclass(frozen=True)
class DiagnoseOptions:
    """How ``diagnose`` measures (every field a keyword of ``diagnose`` too).

    Args:
        which: the diagnostics to run, a subset of ``DIAGNOSTICS``.
        container: the blocks read (``stream.sites.stream_blocks``): default every stage of the first container;
            "all": every block.
        batch_size: images per forward.
        patch_size: the model's patch size, if it cannot be read from the model.
        ridge: the pixel ridge's relative penalty (``pixels.default_lambda``).
        sigma: the low-pass blur's sigma in pixels (default: patch side / 4).
        pixel_patches: patches per image in the pixel ridge, drawn at random (``seed``) per image; None: all.
            64 (of ViT-S/16's 196) keeps the ridge's products below the forward's cost at 1,000 images.
        knockout: "block" (both sub-blocks at once) or "sub_block".
        knockout_images: knock out on the first this many images of each split only (whole batches;
            None: all). Knocking out each of L blocks in turn costs about (L+1)/2 forwards per image (the
            blocks before the knocked-out one are replayed, not run), all the rest together about 1.5:
            at ViT-S/16 the knock-out of 1,000 images would be ~80% of the time; 256 bound it.
        pool: token pooling for the knock-out's pooled change and kNN ("mean", "cls", "patch_mean").
        knn_k: neighbours of the kNN vote.
        seed: seed of the pixel patches' sampling.
    """

    which: tuple = DIAGNOSTICS
    container: str | None = None
    batch_size: int = 32
    patch_size: int | tuple | None = None
    ridge: float = 1e-3
    sigma: float | None = None
    pixel_patches: int | None = 64
    knockout: Literal["block", "sub_block"] = "block"
    knockout_images: int | None = 256
    pool: str = "mean"
    knn_k: int = KNN_K
    seed: int = 0

    def checked(self) -> DiagnoseOptions:
        bad = [w for w in self.which if w not in DIAGNOSTICS]
        if bad:
            raise UserError(f"unknown diagnostic(s) {', '.join(map(str, bad))}; choose from {', '.join(DIAGNOSTICS)}")
        if self.knockout not in UNITS:
            raise UserError(f"knockout unit {self.knockout!r} is unknown; choose one of {', '.join(UNITS)}")
        return self


def _options(options: DiagnoseOptions | None, settings: dict) -> DiagnoseOptions:
    """``options`` with the keywords given to ``diagnose`` put in (an unknown one: one line)."""
    known = {f.name for f in fields(DiagnoseOptions)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UserError(f"diagnose got unknown option(s) {', '.join(unknown)}; DiagnoseOptions has {', '.join(sorted(known))}")
    return replace(options or DiagnoseOptions(), **settings).checked()


@torch.no_grad()
def diagnose(model: nn.Module, images, *, train_images=None, labels=None, train_labels=None,
             conditioning: tuple = (), forward: Forward | None = None, options: DiagnoseOptions | None = None,
             **settings) -> dict:
    """Residual-stream diagnostics of ``model`` on ``images``: a JSON-able dict of per-layer lists.

    Args:
        model: a resdecay model, or a timm / transformers / diffusers one (decayified or not).
        images: the images measured, (N, C, H, W) tensor or array, or a Dataset of (image, label).
        train_images: images the pixel ridge is fitted on and the kNN bank is built from; without
            them the ridge fits on the even-numbered ``images`` and scores on the odd ones, and there is
            no kNN.
        labels, train_labels: class indices of ``images`` / ``train_images`` (else a Dataset's), for kNN.
        conditioning: fixed values a diffusion backbone takes after x, e.g. ``(t, y)`` (``stream.runner``).
        forward: ``forward(model, x)`` running the stream's blocks, for a model ``stream.runner`` does not know.
        options: how to measure (``DiagnoseOptions``); ``**settings``: any of its fields, given alone
            (``which=("paths",)``, ``batch_size=8``), over ``options``.

    Returns:
        ``{"model", "blocks", "kinds", "sub_blocks", "alphas", "images", "train_images", "tokens", "width",
        "paths", "pixels", "branches", "knockout"}`` (the last four as asked by ``which``).
    """
    o = _options(options, settings)
    which = tuple(o.which)
    sites = find_sites(model, o.container)
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    device, dtype = (param.device, param.dtype) if param is not None else (torch.device("cpu"), torch.float32)
    knn = (train_images is not None and (train_labels is not None or isinstance(train_images, Dataset))
           and (labels is not None or isinstance(images, Dataset)))
    opts = {**asdict(o), "split_test": train_images is None, "knn": knn}
    was_training = model.training
    model.eval()
    try:
        with model_runner(model, conditioning, forward, sites) as run:
            first = next(image_batches(images, o.batch_size))[0].to(device=device, dtype=dtype)
            sites = in_run_order(sites, run, first)
            state = _Run(model, sites, which, opts)
            if train_images is not None and ("pixels" in which or ("knockout" in which and knn)):
                state.feed("train", train_images, _tensor(train_labels), run, device, dtype)
            state.feed("test", images, _tensor(labels), run, device, dtype)
    finally:
        model.train(was_training)
    return state.report()


def _tensor(labels) -> torch.Tensor | None:
    return None if labels is None else torch.as_tensor(labels)
