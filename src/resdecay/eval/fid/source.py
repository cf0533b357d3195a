"""The ``samples`` source: images drawn from a diffusion model and the reference statistics of its data
set under a proxy (or Inception) extractor, which the FID metric reads. The diffusion families' online
tracking (``online.py``) prepares it every N epochs: ``check`` builds the extractor and the reference once
(a proxy FID needs more samples than feature dimensions), ``prepare`` draws the samples from the same
seeded noise every time, so the curve measures the model, not the draw."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...diffusion.samplers import sample, to_uint8
from ...errors import ConfigError
from ..metrics import SAMPLES
from ..sources import Evaluation, Prepared, Source
from .proxy import PROXY_DATASETS, default_cache_dir, proxy_extractor
from .stats import dataset_reference

__all__ = ["SampleSet"]


@dataclass
class SampleSet:
    """What a ``samples`` metric reads: generated images, the reference statistics and the extractor."""

    samples: Any  # float tensor in [0, 1], uint8 NHWC array or an .npz path (eval.fid reads all three)
    reference: dict
    extractor: torch.nn.Module


def _check(ev: Evaluation, metrics: list) -> None:
    """The extractor and the train split's reference statistics, built once (cached beside the extractor)."""
    d, m, size = ev.data, ev.cfg.model, ev.settings.size
    if d.name not in PROXY_DATASETS:
        raise ConfigError(f"train.online_eval_every for a diffusion model scores samples with a proxy FID, which needs "
                          f"one of {', '.join(PROXY_DATASETS)} (data.name={d.name}); set train.online_eval_every=0 "
                          "and score checkpoints with `resdecay sample` + `resdecay fid`")
    extractor = proxy_extractor(d.name, data_path=d.path, in_chans=m.in_chans, device=ev.device)
    ref_out = default_cache_dir() / f"{d.name}-train-{extractor.name}.pt"  # next to the extractor, built once
    reference, ref_path, _ = dataset_reference(d.name, extractor, d.path, device=ev.device, ref_out=ref_out, progress=False)
    dim = len(reference["mu"])
    if size <= dim:  # n samples give a covariance of rank <= n - 1
        raise ConfigError(f"train.online_eval_size={size} is too few samples for a proxy FID on {dim}-d features; "
                          f"set train.online_eval_size to at least {dim + 1} (e.g. 1000)")
    ev.shared.update(extractor=extractor, reference=reference, reference_path=ref_path)


def _prepare(ev: Evaluation, metrics: list):
    s, m = ev.settings, ev.cfg.model
    g = torch.Generator().manual_seed(0)
    x = sample(ev.model, s.size, sampler=s.sampler, steps=s.steps, image_shape=(m.in_chans, m.img_size, m.img_size),
               generator=g, device=ev.device, batch_size=500, clip_denoised=True)
    yield Prepared(None, SampleSet(to_uint8(x.cpu()), ev.shared["reference"], ev.shared["extractor"]), {})


SOURCES = (Source(SAMPLES, prepare=_prepare, check=_check),)  # registered by eval/__init__.py
