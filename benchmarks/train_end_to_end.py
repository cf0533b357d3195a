"""End-to-end MAE pretraining throughput from JPEG files: the real ``resdecay pretrain`` command
(data workers, host-to-device copy, forward, backward, AdamW, logging, checkpoints) on a folder of
real-size JPEGs, once per ImageFolder decoder, in one run, the decoders interleaved.

What is measured
    Each row runs ``python -m resdecay pretrain`` in a fresh process on the same JPEG folder and
    reads the images/s that the trainer itself logs (``log.jsonl``, one value per log window of
    ``--log-every`` steps). The first window is dropped (it holds worker start-up and, with
    ``--compile``, compilation); the row gives the median of the remaining windows over all
    rounds. The decoders (``data.decoder``):

    pil      PIL decode, torchvision v1 RandomResizedCrop/flip, ToTensor + Normalize in the workers
             (the older path): float32 batches.
    tensor   TorchCodec decode (PIL without it) + ``transforms.v2`` on uint8 in the workers, uint8
             batches, copied on a side stream and normalised on the device (the default).
    dali     NVIDIA DALI decodes the crop windows (nvJPEG on a GPU; DALI's CPU decoder otherwise);
             only when the ``nvidia-dali`` package is installed.

    "vs pil" divides by the pil row. "model only" (``--model-only``) adds the same preset's
    training step on one synthetic batch already on the device (no data at all), measured in this
    process: the rate a data path would have to reach to stop being the bottleneck.

The images
    ``--images`` JPEGs of ~500x375 (as ``data_throughput.py`` makes them: cut from scikit-learn's
    sample photographs, quality 90) in a temporary ImageFolder with 4 classes.

    python benchmarks/train_end_to_end.py                                  # CPU: a small RGB MAE
    python benchmarks/train_end_to_end.py --preset mae-b16 --workers 15 --images 4096 \\
        --batch-size 256 --epochs 3 --model-only                            # one H100 with 16 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from _measure import bad_input, mae_config, timed_steps
from data_throughput import dali_available, make_jpegs
from mae_throughput import Variant
from resdecay.models import build_model

# A small RGB U-Net MAE for the CPU (the digits architecture on 32x32 RGB crops, 16 patches of 8x8): its
# step is cheap enough that the data path, not the model, decides the rate on a laptop.
CPU_PRESET = "mae-tiny-digits"
CPU_OVERRIDES = ["model.img_size=32", "model.in_chans=3", "model.patch_size=8", "train.batch_size=32"]


def pretrain(preset: str, overrides: list[str], out: Path, env: dict) -> list[float]:
    """Run ``resdecay pretrain`` to the end; return the img/s of every logged window."""
    cmd = [sys.executable, "-m", "resdecay", "pretrain", "--no-progress", "--preset", preset, *overrides,
           f"train.out_dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode == 2:  # resdecay refused a setting in one line: pass that line on
        bad_input(proc.stderr.strip().splitlines()[-1].removeprefix("resdecay: error: "))
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line.strip()]
    return [r["img_per_s"] for r in rows if "img_per_s" in r]


def model_only(cfg, batch: int, steps: int, device: torch.device) -> float:
    """img/s of the training step ``mae_throughput.py`` times (model, AdamW as the trainer makes it,
    bf16 autocast on CUDA) on one batch already on the device."""
    torch.manual_seed(0)
    imgs = torch.randn(batch, cfg.model.in_chans, cfg.model.img_size, cfg.model.img_size, device=device)
    v = Variant("model only", "U-Net", None, lambda: build_model(cfg.model).to(device), True, cfg, imgs, device)
    v.build(warmup=3)
    times = timed_steps(v.step, 0, steps, device)[0]
    return batch / statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default=None, help=f"MAE preset (default: {CPU_PRESET} on 32x32 RGB crops on the CPU, "
                                                   "mae-b16 on a GPU)")
    ap.add_argument("--images", type=int, default=384, help="JPEGs in the generated folder")
    ap.add_argument("--batch-size", type=int, default=None, help="train.batch_size (default: 32 on the CPU, the preset's on a GPU)")
    ap.add_argument("--workers", type=int, default=None, help="data.num_workers (default: cores - 1, at least 1)")
    ap.add_argument("--epochs", type=int, default=4, help="train.epochs per run")
    ap.add_argument("--log-every", type=int, default=4, help="train.log_every: steps per measured window")
    ap.add_argument("--rounds", type=int, default=2, help="runs per decoder, interleaved")
    ap.add_argument("--decoders", default=None, help="comma-separated subset of pil,tensor,dali (default: all available)")
    ap.add_argument("--threads", type=int, default=None, help="train.threads of the training process (default on the CPU: cores - workers)")
    ap.add_argument("--compile", action="store_true", help="train.compile=true")
    ap.add_argument("--model-only", action="store_true", help="add the synthetic-batch step rate of the same model")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    for name in ("images", "epochs", "log_every", "rounds"):
        if getattr(args, name) < 1:
            bad_input(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if (args.workers is not None and args.workers < 0) or (args.batch_size is not None and args.batch_size < 1):
        bad_input("--workers must be >= 0 and --batch-size >= 1")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    preset = args.preset or ("mae-b16" if cuda else CPU_PRESET)
    overrides = list(CPU_OVERRIDES) if preset == CPU_PRESET and args.preset is None else []
    workers = args.workers if args.workers is not None else max(1, (os.cpu_count() or 2) - 1)
    if args.batch_size:
        overrides.append(f"train.batch_size={args.batch_size}")
    overrides += ["data.name=imagefolder", "data.augment=mae", f"data.num_workers={workers}", f"train.epochs={args.epochs}",
                  "train.warmup_epochs=1", f"train.log_every={args.log_every}", "train.ckpt_every=1000000"]
    threads = args.threads or (None if cuda else max(1, (os.cpu_count() or 2) - workers))  # workers + trainer = cores
    if threads:
        overrides.append(f"train.threads={threads}")
    if args.compile:
        overrides.append("train.compile=true")
    cfg = mae_config(preset, [o for o in overrides if o.startswith(("model.", "train."))])  # refuses a bad preset now
    decoders = args.decoders.split(",") if args.decoders else ["pil", "tensor"] + (["dali"] if dali_available() else [])
    bad = [d for d in decoders if d not in ("pil", "tensor", "dali")]
    if bad or ("dali" in decoders and not dali_available()):
        bad_input(f"--decoders: unknown or unavailable {bad or ['dali']}; choose from pil,tensor"
                  + (",dali" if dali_available() else " (dali needs: pip install nvidia-dali-cuda130)"))

    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    load = os.getloadavg()
    print(f"train_end_to_end | torch {torch.__version__} | {device.type} ({name}) | {os.cpu_count()} CPUs | "
          f"load average {load[0]:.2f}")
    print(f"resdecay pretrain --preset {preset} {' '.join(overrides)}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    rates: dict[str, list[float]] = {d: [] for d in decoders}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "jpegs"
        make_jpegs(root, args.images)
        for r in range(args.rounds):
            k = r % len(decoders)
            for dec in decoders[k:] + decoders[:k]:  # rotate the order every round
                windows = pretrain(preset, overrides + [f"data.path={root}", f"data.decoder={dec}"],
                                   Path(tmp) / f"run-{dec}-{r}", env)
                rates[dec] += windows[1:]  # the first window holds start-up
    for dec, v in rates.items():
        if not v:
            bad_input(f"{dec}: fewer than two log windows; raise --epochs or --images, or lower --log-every")
    ref = statistics.median(rates["pil"]) if "pil" in rates else None
    rows = []
    head = f"{'decoder':<14}{'img/s end to end':>18}{'min..max':>16}{'windows':>9}{'vs pil':>9}"
    print(head)
    print("-" * len(head))
    for dec, v in rates.items():
        med = statistics.median(v)
        rows.append({"decoder": dec, "img_per_s": med, "windows": v, "ratio_to_pil": med / ref if ref else None})
        ratio = f"{med / ref:.2f}x" if ref else "-"
        print(f"{dec:<14}{med:>18.1f}{f'{min(v):.0f}..{max(v):.0f}':>16}{len(v):>9}{ratio:>9}")
    result = {"benchmark": "train_end_to_end", "torch": torch.__version__, "device": device.type, "device_name": name,
              "cpus": os.cpu_count(), "load_average": load, "preset": preset, "overrides": overrides,
              "images": args.images, "rounds": args.rounds, "rows": rows}
    if args.model_only:
        if threads and not cuda:
            torch.set_num_threads(threads)
        rate = result["model_only_img_per_s"] = model_only(cfg, cfg.train.batch_size, 10, device)
        print(f"{'model only':<14}{rate:>18.1f}{'':>16}{'':>9}{'':>9}   (one synthetic batch on the device, no data)")
    print(f"{workers} data workers | {args.images} JPEGs ~500x375 | {args.epochs} epochs per run | median over log windows "
          f"of {args.log_every} steps, the first of each run dropped | {time.perf_counter() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
