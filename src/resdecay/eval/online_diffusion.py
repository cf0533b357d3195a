"""Online tracking of a diffusion model during training: every N epochs, a proxy FID of freshly drawn
samples and the best cell of a small probe grid, written into the run's log.jsonl as ``online_*``
values (``resdecay plot`` draws them against the epoch).

Why: with decayed shortcuts the paper reports *both* better samples (Table 4's FID) and more
abstract features (its probe column); the curves show whether and when the two separate from a
plain model's, without keeping and re-sampling every checkpoint. The samples come from the EMA
weights (what ``resdecay sample`` uses), from the same seeded noise every time, so the curve
measures the model, not the draw; the probe uses the first N train / test images.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Subset

from ..data import build_dataset
from ..errors import ConfigError
from .diffusion_probe import probe_grid
from .fid import PROXY_DATASETS, compute_fid, default_cache_dir, proxy_extractor
from .fid_cli import dataset_reference

ONLINE_LEVELS = (0.0, 0.25)  # clean and lightly noised: where Table 4's best cells lie
ONLINE_STEPS = {"dpm-solver++": 25}  # U-ViT's sampler at the 25 steps RESULTS §10 uses; dopri5 picks its own


class OnlineDiffusionEval:
    def __init__(self, cfg, every: int, size: int, device: torch.device):
        from ..diffusion.samplers import DEFAULT_SAMPLER, DEFAULT_STEPS

        m, d = cfg.model, cfg.data
        if d.name not in PROXY_DATASETS:
            raise ConfigError(f"train.online_eval_every for a diffusion model scores samples with a proxy FID, which needs "
                              f"one of {', '.join(PROXY_DATASETS)} (data.name={d.name}); set train.online_eval_every=0 "
                              "and score checkpoints with `resdecay sample` + `resdecay fid`")
        self.every, self.epochs, self.device, self.size = every, cfg.train.epochs, device, size
        self.extractor = proxy_extractor(d.name, data_path=d.path, in_chans=m.in_chans, device=device)
        ref_out = default_cache_dir() / f"{d.name}-train-{self.extractor.name}.pt"  # next to the extractor, built once
        self.ref, ref_path, _ = dataset_reference(d.name, self.extractor, d.path, device=device, ref_out=ref_out, progress=False)
        dim = len(self.ref["mu"])
        if size <= dim:  # n samples give a covariance of rank <= n - 1
            raise ConfigError(f"train.online_eval_size={size} is too few samples for a proxy FID on {dim}-d features; "
                              f"set train.online_eval_size to at least {dim + 1} (e.g. 1000)")
        self.sampler = DEFAULT_SAMPLER[m.objective]
        self.steps = ONLINE_STEPS.get(self.sampler, DEFAULT_STEPS.get(self.sampler, 50))
        self.shape = (m.in_chans, m.img_size, m.img_size)
        bank, _ = build_dataset(d, "train", m.img_size, augment=False)
        queries, _ = build_dataset(d, "test", m.img_size, augment=False)
        self.bank = Subset(bank, range(min(size, len(bank))))
        self.queries = Subset(queries, range(min(size, len(queries))))
        self.protocol = {"data": d.name, "samples": f"{size} samples, EMA weights when kept, seed 0, no guidance",
                         "sampler": self.sampler, "steps": "adaptive" if self.sampler == "dopri5" else self.steps,
                         "fid": f"{self.extractor.label} vs the train split ({ref_path})",
                         "probe": f"fast linear probe, mean tokens of every block, noise levels {list(ONLINE_LEVELS)}, "
                                  f"first {len(self.bank)} train -> first {len(self.queries)} test images, null label"}

    def __call__(self, model, epoch: int, step: int, log) -> None:
        from ..diffusion.samplers import sample, to_uint8

        done = epoch + 1
        if done % self.every and done != self.epochs:
            return
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(0)
        x = sample(model, self.size, sampler=self.sampler, steps=self.steps, image_shape=self.shape, generator=g,
                   device=self.device, batch_size=500, clip_denoised=True)
        fid = compute_fid(to_uint8(x.cpu()), self.ref, self.extractor, device=self.device)
        grid = probe_grid(model, self.bank, self.queries, levels=ONLINE_LEVELS, device=self.device, progress=False)
        best = grid["best"]
        row = {"step": step, "epoch": float(done), "online_proxy_fid": fid["value"], "online_probe_best_top1": best["top1"],
               "online_probe_best_cell": {"block": best["layer"], "noise": best["level"]},
               "online_eval_s": time.perf_counter() - t0, "online_protocol": self.protocol}
        log.write(row)
        print(f"epoch {done}: online {fid['label']} {fid['value']:.3f}, best probe {best['top1']:.4f} "
              f"(block {best['layer']}, noise {best['level']:g}) [{row['online_eval_s']:.0f} s]")
