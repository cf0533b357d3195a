"""The parsers of ``resdecay``'s diffusion subcommands: sample, fid, latents, eval-diffusion (wired into
cli/main.py; the commands run in ``commands/``)."""

from __future__ import annotations

import argparse

from ..commands.evaluate import eval_diffusion_command
from ..commands.fid import fid_command
from ..commands.latents import run_latents
from ..commands.sample import sample_command
from ..diffusion.samplers import SAMPLERS
from .parents import data_options, device_option, progress_option


def add_commands(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sample", parents=[device_option(), progress_option()], help="sample a diffusion checkpoint: PNG grid + ADM-format .npz (torchrun splits N)")
    s.add_argument("checkpoint")
    s.add_argument("--n", "--num-samples", dest="n", type=int, default=64,
                   help="number of samples, split across ranks (under torchrun spell it --num-samples: torchrun reads --n as its own)")
    s.add_argument("--sampler", default=None, choices=list(SAMPLERS), help="ddpm | ddim | dpm-solver++ (eps models; default dpm-solver++) | "
                                                   "euler | heun | euler-maruyama | dopri5 (velocity models; default dopri5, the paper's)")
    s.add_argument("--steps", type=int, default=None, help="sampling steps (default: 50 for dpm-solver++, 250 for "
                                                           "euler-maruyama); for dopri5 the most steps it may take (default 1000)")
    s.add_argument("--atol", type=float, default=None, help="dopri5's absolute tolerance (default 1e-6, SiT's)")
    s.add_argument("--rtol", type=float, default=None, help="dopri5's relative tolerance (default 1e-3, SiT's)")
    s.add_argument("--guidance-scale", dest="guidance_scale", type=float, default=1.0,
                   help="classifier-free guidance scale (1 = none; needs model.class_dropout > 0 in training)")
    # --cfg: the old spelling (cfg also names configs everywhere else), kept hidden so old scripts still run
    s.add_argument("--cfg", dest="guidance_scale", type=float, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    s.add_argument("--labels", default=None, help="comma list of class indices, cycled (default: random)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=256)
    s.add_argument("--vae", default=None, help="VAE folder to decode latent models (diffusers AutoencoderKL)")
    s.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA")
    s.add_argument("--out", default=None, help="output folder (default <run>/samples)")
    s.set_defaults(func=lambda a: sample_command(a.checkpoint, a.labels, n=a.n, sampler=a.sampler, steps=a.steps,
                                                  cfg_scale=a.guidance_scale, seed=a.seed, batch_size=a.batch_size,
                                                  vae=a.vae, out=a.out, device=a.device, use_ema=not a.no_ema,
                                                  progress=not a.no_progress, atol=a.atol, rtol=a.rtol))

    f = sub.add_parser("fid", parents=[device_option(), progress_option()], help="FID (Inception weights from a local file) or proxy FID of samples against a reference or a second image set")
    f.add_argument("samples", nargs="+", metavar="IMAGES",
                   help="an ADM-format .npz (arr_0: uint8 NHWC, e.g. from `resdecay sample`) or a folder of PNG/JPEG images; "
                        "a second one is the reference (fid A.npz B.npz, fid dirA dirB)")
    f.add_argument("--ref", default=None, help="reference: statistics file (.pt), a dataset name to build them from, or an image set")
    f.add_argument("--data", default=None, help="with --proxy and two image sets: the dataset whose proxy network to use")
    f.add_argument("--data-path", default=None, help="dataset folder when --ref is a dataset name, or to train the proxy")
    f.add_argument("--ref-out", default=None, help="where to save statistics built from a dataset (default runs/fid_refs/...)")
    f.add_argument("--inception-weights", default=None, help="FID Inception weights file (pt_inception-2015-12-05-*.pth)")
    f.add_argument("--proxy", action="store_true", help="proxy FID: features of a small classifier trained on the dataset")
    f.add_argument("--batch-size", type=int, default=200, help="extraction batch size (fixed; recorded)")
    f.add_argument("--allow-few", action="store_true", help="allow fewer samples than feature dimensions")
    f.add_argument("--img-size", type=int, default=None, help="reference resolution for --ref imagefolder (resize + centre crop; default 256)")
    f.set_defaults(func=lambda a: fid_command(a.samples, a.ref, data_path=a.data_path, inception_weights=a.inception_weights,
                                               proxy=a.proxy, batch_size=a.batch_size, device=a.device, ref_out=a.ref_out,
                                               allow_few=a.allow_few, progress=not a.no_progress, img_size=a.img_size,
                                               data=a.data))

    la = sub.add_parser("latents", parents=[device_option(), progress_option()], help="encode a dataset once with a local VAE for latent diffusion")
    la.add_argument("--vae", default=None, help="a local diffusers AutoencoderKL folder (required)")
    la.add_argument("--data", required=True, help="digits, fashion-mnist, cifar10, cifar100, imagefolder")
    la.add_argument("--data-path", default=None)
    la.add_argument("--img-size", type=int, default=256, help="pixel side fed to the VAE (latents are 1/8 of it)")
    la.add_argument("--batch-size", type=int, default=64)
    la.add_argument("--out", required=True, help="output folder for train.pt / test.pt")
    la.set_defaults(func=lambda a: run_latents(a.data, a.data_path, a.vae, a.out, a.img_size, a.batch_size, a.device,
                                               progress=not a.no_progress))

    e = sub.add_parser("eval-diffusion", parents=[data_options(), device_option(), progress_option()], help="linear probe per (block, noise level) of a diffusion model: heat map + best cell")
    e.add_argument("checkpoint")
    e.add_argument("--layers", default="all", help="'all' or a comma list of block indices")
    e.add_argument("--noise-levels", default="0,0.1,0.25,0.5,0.75", help="fractions of the diffusion time, 0 = clean")
    e.add_argument("--max-train", type=int, default=None)
    e.add_argument("--max-test", type=int, default=None)
    e.add_argument("--batch-size", type=int, default=256)
    e.add_argument("--out", default=None, help="output folder (default <run>/eval_diffusion)")
    e.set_defaults(func=lambda a: eval_diffusion_command(a.checkpoint, a.data, a.data_path, a.out, a.layers, a.noise_levels,
                                                          max_train=a.max_train, max_test=a.max_test, device=a.device,
                                                          batch_size=a.batch_size, progress=not a.no_progress))
