"""The diffusion subcommands of ``resdecay``: sample, fid, latents, eval-diffusion (wired into cli.py)."""

from __future__ import annotations

import argparse
import json

from ..commands.evaluate import format_grid, run_eval_diffusion
from ..commands.fid import run_fid
from ..commands.sample import run_sample
from ..data import DataConfig
from ..data.vae import encode_dataset
from ..diffusion.samplers import SAMPLERS
from ..errors import UserError
from ..eval.inputs import check_data_path
from ..train.distributed import resolve_device
from .parents import data_options, device_option, progress_option


def _data_cfg(name: str | None, path: str | None, normalize: str = "dataset"):
    if name is None:
        if path:
            raise UserError("--data-path needs --data (digits, fashion-mnist, cifar10, cifar100, imagefolder, latents)")
        return None
    check_data_path(name, path)  # digits reads no folder: a path beside it would be silently ignored
    cfg = DataConfig(name=name, path=path, normalize=normalize)
    cfg.validate()
    return cfg


def _levels(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--noise-levels takes comma-separated numbers in [0, 1], e.g. 0,0.1,0.25; got {text!r}") from None


def cmd_sample(args) -> None:
    labels = None
    if args.labels:
        try:
            labels = [int(v) for v in args.labels.split(",")]
        except ValueError:
            raise UserError(f"--labels takes comma-separated class indices, got {args.labels!r}") from None
    r = run_sample(args.checkpoint, n=args.n, sampler=args.sampler, steps=args.steps, cfg_scale=args.guidance_scale,
                   labels=labels, seed=args.seed, batch_size=args.batch_size, vae=args.vae, out=args.out, device=args.device,
                   use_ema=not args.no_ema, progress=not args.no_progress, atol=args.atol, rtol=args.rtol)
    if r:
        steps = (f"adaptive (atol {r['atol']:g}, rtol {r['rtol']:g}, at most {r['steps']} steps)" if r["sampler"] == "dopri5"
                 else f"{r['steps']} steps")
        print(f"{r['n']} samples | sampler {r['sampler']}, {steps}, {r['nfe']:g} network evaluations per batch, "
              f"guidance scale {r['cfg_scale']:g}, {r['weights']} weights, seed {r['seed']}\nwrote {r['png']} and {r['npz']}")


def cmd_latents(args) -> None:
    device = resolve_device(args.device, "--device")
    written = encode_dataset(_data_cfg(args.data, args.data_path), args.vae, args.out, args.img_size, args.batch_size,
                             device, progress=not args.no_progress)
    for split, w in written.items():
        print(f"{split}: {w['n']} latents of shape {w['shape']} (x {w['scaling_factor']:g}) -> {w['path']}")
    print(f"train with: data.name=latents data.path={args.out}")


def cmd_eval_diffusion(args) -> None:
    try:
        layers = None if args.layers == "all" else [int(v) for v in args.layers.split(",")]
    except ValueError:
        raise UserError(f"--layers takes 'all' or comma-separated block indices, e.g. 0,3,6; got {args.layers!r}") from None
    r = run_eval_diffusion(args.checkpoint, data=_data_cfg(args.data, args.data_path, "symmetric"), out=args.out, layers=layers,
                           levels=_levels(args.noise_levels), max_train=args.max_train, max_test=args.max_test,
                           device=args.device, batch_size=args.batch_size, progress=not args.no_progress)
    print(format_grid(r))
    print(f"wrote {r['paths']['json']} and {r['paths']['png']}")


def cmd_fid(args) -> None:
    if len(args.samples) > 2:
        raise UserError(f"fid compares two image sets at most, got {len(args.samples)}: fid A B, or fid A --ref STATS|DATASET")
    if len(args.samples) == 2 and args.ref:
        raise UserError(f"two image sets are compared with each other, so --ref {args.ref} would be a third: "
                        "drop --ref or the second set")
    ref = args.samples[1] if len(args.samples) == 2 else args.ref
    r = run_fid(args.samples[0], ref=ref, data_path=args.data_path, inception_weights=args.inception_weights,
                proxy=args.proxy, batch_size=args.batch_size, device=args.device, ref_out=args.ref_out,
                allow_few=args.allow_few, progress=not args.no_progress, img_size=args.img_size, data=args.data)
    print(f"{r['label']}: {r['value']:.4f}")
    print(json.dumps(r["protocol"], indent=1))


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
    s.set_defaults(func=cmd_sample)

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
    f.set_defaults(func=cmd_fid)

    la = sub.add_parser("latents", parents=[device_option(), progress_option()], help="encode a dataset once with a local VAE for latent diffusion")
    la.add_argument("--vae", default=None, help="a local diffusers AutoencoderKL folder (required)")
    la.add_argument("--data", required=True, help="digits, fashion-mnist, cifar10, cifar100, imagefolder")
    la.add_argument("--data-path", default=None)
    la.add_argument("--img-size", type=int, default=256, help="pixel side fed to the VAE (latents are 1/8 of it)")
    la.add_argument("--batch-size", type=int, default=64)
    la.add_argument("--out", required=True, help="output folder for train.pt / test.pt")
    la.set_defaults(func=cmd_latents)

    e = sub.add_parser("eval-diffusion", parents=[data_options(), device_option(), progress_option()], help="linear probe per (block, noise level) of a diffusion model: heat map + best cell")
    e.add_argument("checkpoint")
    e.add_argument("--layers", default="all", help="'all' or a comma list of block indices")
    e.add_argument("--noise-levels", default="0,0.1,0.25,0.5,0.75", help="fractions of the diffusion time, 0 = clean")
    e.add_argument("--max-train", type=int, default=None)
    e.add_argument("--max-test", type=int, default=None)
    e.add_argument("--batch-size", type=int, default=256)
    e.add_argument("--out", default=None, help="output folder (default <run>/eval_diffusion)")
    e.set_defaults(func=cmd_eval_diffusion)
