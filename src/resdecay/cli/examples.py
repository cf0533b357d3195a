"""One or two examples at the end of every subcommand's --help (the commands people type first)."""

from __future__ import annotations

import argparse

EXAMPLES = {
    "demo": ["resdecay demo", "resdecay demo --data digits --epochs 2"],
    "alpha": ["resdecay alpha --depth 24 --alpha-min 0.7", "resdecay alpha --depth 24 --target-eff 5e-3 --json"],
    "pretrain": ["resdecay pretrain --preset mae-tiny-fmnist alpha_min=0.7 train.epochs=50",
                 "resdecay pretrain --preset mae-tiny-fmnist alpha_min=0.7 train.epochs=50 --resume auto"],
    "finetune": ["resdecay finetune runs/mae-tiny-fmnist/checkpoints/step_00007020.pt --preset linprobe-mae"],
    "train-supervised": ["resdecay train-supervised --preset resnet18-cifar10 alpha_min=0.7 data.path=/data/cifar"],
    "ablate": ["resdecay ablate --list", "resdecay ablate --grid where-fmnistm --only \"plain MAE,alpha 0.8\""],
    "eval": ["resdecay eval runs/mae-tiny-fmnist/checkpoints/step_00007020.pt",
             "resdecay eval RUN_A/checkpoints/step_*.pt RUN_B/checkpoints/step_*.pt --layer all"],
    "compare": ["resdecay compare runs/mae-tiny-fmnist-plain runs/mae-tiny-fmnist"],
    "plot": ["resdecay plot runs/mae-tiny-fmnist-plain runs/mae-tiny-fmnist --out runs/plot"],
    "figures": ["resdecay figures PLAIN/checkpoints/step_00007020.pt DECAYED/checkpoints/step_00007020.pt"],
    "sample": ["resdecay sample runs/uvit-tiny-fmnist/checkpoints/step_*.pt --n 1000 --sampler dpm-solver++ --steps 25"],
    "fid": ["resdecay fid runs/uvit-tiny-fmnist/samples/samples_*.npz --ref fashion-mnist --proxy"],
    "latents": ["resdecay latents --vae /models/sd-vae-ft-ema --data imagefolder --data-path /data/in100 --img-size 256 --out /data/in100-latents"],
    "eval-diffusion": ["resdecay eval-diffusion runs/uvit-tiny-fmnist/checkpoints/step_*.pt --noise-levels 0,0.1,0.25,0.5"],
    "presets": ["resdecay presets"],
    "import-weights": ["resdecay import-weights mae_pretrain_vit_base.pth --format mae --preset mae-b16-plain "
                       "--out runs/imported/mae-b16.pt data.path=/data/imagenet"],
    "export": ["resdecay export runs/mae-tiny-fmnist/checkpoints/step_00007020.pt --to timm --out vit.safetensors"],
    "check-data": ["resdecay check-data --data-path /data/imagenet",
                   "resdecay check-data --preset mae-b16 data.path=/data/imagenet"],
}


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Append the examples to each subcommand's help (kept verbatim: RawDescriptionHelpFormatter)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                lines = EXAMPLES.get(name)
                if lines:
                    head = "example:" if len(lines) == 1 else "examples:"
                    sub.epilog = head + "\n" + "\n".join(f"  {line}" for line in lines)
                    sub.formatter_class = argparse.RawDescriptionHelpFormatter
