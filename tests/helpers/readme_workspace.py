"""The tiny artifacts the executable-docs test (tests/e2e/test_readme_commands.py) stands in for the pages'
placeholder paths: runs, samples, foreign weights and data folders, each built on first use."""

from __future__ import annotations

import argparse
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from resdecay.cli import main

from . import readme_commands as rc
from . import write_idx


class Workspace:
    """Tiny artifacts shared by the commands (runs, samples, foreign weights), each built on first use."""

    def __init__(self, root: Path):
        self.root = root


    @cached_property
    def fmnist(self) -> Path:  # Fashion-MNIST's IDX files: 160 train images (proxy FID needs > 128), 40 test
        root = self.root / "fmnist"
        root.mkdir()
        rng = np.random.default_rng(1)
        for split, n in (("train", 160), ("t10k", 40)):
            write_idx(root / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
            write_idx(root / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        return root

    @cached_property
    def imagefolder(self) -> Path:  # ImageNet's layout, 2 classes: 24 train images (kNN's k is 20), 8 val
        from PIL import Image

        rng = np.random.default_rng(2)
        for split, n in (("train", 12), ("val", 4)):
            for cls in ("cat", "dog"):
                (folder := self.root / "imnet" / split / cls).mkdir(parents=True)
                for i in range(n):
                    Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(folder / f"{i}.png")
        return self.root / "imnet"

    def _pretrain(self, name: str, preset: str, shrink, *extra: str) -> Path:
        from resdecay.commands.pretrain import run_pretrain

        keep = [o.format(fmnist=self.fmnist) for o in shrink if "=" in o and "{tmp}" not in o]  # overrides, not flags
        out = self.root / "runs" / name
        run_pretrain(preset, [*keep, *extra, "train.keep_last=1", f"train.out_dir={out}"], progress=False)
        return out

    def _mae(self, name: str, preset: str, *extra: str) -> Path:
        # the CSV tracker alone: the commands read log.jsonl and the checkpoints (no command reads tb/), and a tracker
        # that shows images would get each online evaluation's figures drawn for it
        return self._pretrain(name, preset, rc.FMNIST, "train.epochs=2", "train.online_eval_every=1",
                              "train.online_eval_size=32", "train.loggers=[csv]", *extra)

    @cached_property
    def mae_run(self) -> Path:
        return self._mae("mae-tiny-fmnist", "mae-tiny-fmnist")

    @cached_property
    def mae_plain_run(self) -> Path:
        return self._mae("mae-tiny-fmnist-plain", "mae-tiny-fmnist-plain")

    @cached_property
    def mae_run_07(self) -> Path:
        return self._mae("mae-tiny-fmnist-0.7", "mae-tiny-fmnist", "alpha_min=0.7")

    @property
    def mae_ckpt(self) -> Path:
        return only_checkpoint(self.mae_run)

    @property
    def mae_plain_ckpt(self) -> Path:
        return only_checkpoint(self.mae_plain_run)

    @cached_property
    def evaluated(self) -> None:  # eval.json in both runs, for compare
        for run in (self.mae_plain_run, self.mae_run):
            assert main(["eval", str(only_checkpoint(run)), *rc.EVAL_SIZE, "--no-progress"]) == 0

    @cached_property
    def uvit_run(self) -> Path:  # with <run>/samples/samples_*.npz: 130 samples, one more than proxy FID's 128 dims
        from resdecay.commands.sample import run_sample

        run = self._pretrain("uvit-tiny-fmnist", "uvit-tiny-fmnist", rc.UVIT)
        run_sample(str(only_checkpoint(run)), n=130, steps=2, out=str(run / "samples"), progress=False)
        return run

    def _sit(self, name: str) -> Path:
        return self._pretrain(name, name, rc.SIT, "train.online_eval_every=1", "train.online_eval_size=130")

    @cached_property
    def sit_run(self) -> Path:
        return self._sit("sit-tiny-fmnist")

    @cached_property
    def sit_plain_run(self) -> Path:
        return self._sit("sit-tiny-fmnist-plain")

    @cached_property
    def vae(self) -> Path:  # a tiny diffusers AutoencoderKL (8 px -> 4x4x4 latents)
        import diffusers

        vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                                      up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 8),
                                      latent_channels=4, norm_num_groups=4, sample_size=8)
        vae.save_pretrained(self.root / "vae")
        return self.root / "vae"

    @cached_property
    def latents(self) -> Path:
        assert main(["latents", "--vae", str(self.vae), "--data", "digits", "--img-size", "8", "--out",
                     str(self.root / "latents"), "--no-progress"]) == 0
        return self.root / "latents"

    @cached_property
    def sit_latent_ckpt(self) -> Path:
        run = self._pretrain("sit-xl2", "sit-xl2", rc.SIT_LATENT, f"data.path={self.latents}")
        return only_checkpoint(run)

    @cached_property
    def mae_pth(self) -> Path:  # facebookresearch/mae's layout: {'model': ..., 'args': Namespace, ...}; RGB as ImageNet's
        from helpers.interop import resdecay_checkpoint

        src, _ = resdecay_checkpoint(self.root / "mae_src.pt", "mae-tiny-digits-plain", ["model.in_chans=3"])
        torch.save({"model": src.state_dict(), "epoch": 799, "args": argparse.Namespace(mask_ratio=0.75)},
                   self.root / "mae_pretrain.pth")
        return self.root / "mae_pretrain.pth"

    @cached_property
    def unet_pth(self) -> Path:  # the authors' U-Net MAE layout; their script saves args.min_decay
        from helpers.interop import authors_unet_layout, resdecay_checkpoint

        src, _ = resdecay_checkpoint(self.root / "unet_src.pt", "mae-tiny-digits", ["alpha_min=0.6", "model.in_chans=3"])
        torch.save({"model": authors_unet_layout(src.state_dict()), "args": argparse.Namespace(min_decay=0.6)},
                   self.root / "unet_mae.pth")
        return self.root / "unet_mae.pth"

    @cached_property
    def timm_pth(self) -> Path:  # a timm ViT state_dict with ViT-S's 6 heads
        from helpers.interop import tiny_timm

        torch.save(tiny_timm(num_heads=6).state_dict(), self.root / "vit.pth")
        return self.root / "vit.pth"

    @cached_property
    def inception(self) -> Path:  # FID Inception-v3's layout with random weights (the real file is not shipped)
        from torchvision.models import inception_v3

        net = inception_v3(weights=None, aux_logits=False, num_classes=1008, init_weights=False)
        torch.save(net.state_dict(), self.root / "pt_inception.pth")
        return self.root / "pt_inception.pth"

    @cached_property
    def cifar_samples(self) -> Path:
        np.savez(self.root / "samples.npz", arr_0=np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8))
        return self.root / "samples.npz"

    @cached_property
    def mae_b16_run(self) -> Path:  # docs/finetune.md's runs/mae-b16: the ImageNet preset, shrunk, on the ImageFolder
        return self._pretrain("mae-b16", "mae-b16", rc.IMAGENET, f"data.path={self.imagefolder}")

    @property
    def mae_b16_ckpt(self) -> Path:
        return only_checkpoint(self.mae_b16_run)

    @cached_property
    def mae_b16_finetuned(self) -> None:  # <run>/finetune-mae/checkpoints/best.pt, where finetune puts it
        keep = [o for o in rc.FT_IMAGENET if "=" in o and "out_dir" not in o]
        assert main(["finetune", str(self.mae_b16_ckpt), "--preset", "finetune-mae", *keep, "--no-progress"]) == 0
        assert (self.mae_b16_run / "finetune-mae" / "checkpoints" / "best.pt").is_file()

    @cached_property
    def shards(self) -> Path:  # `resdecay shard` of the ImageFolder stand-in: 3 train shards, 1 val shard
        assert main(["shard", "--data-path", str(self.imagefolder), "--out", str(self.root / "shards"), "--shard-size", "8",
                     "--no-progress"]) == 0
        return self.root / "shards"

    @cached_property
    def brace_shards(self) -> Path:  # train-000000..000127.tar and val-000000..000009.tar: one 8x8 image each
        from PIL import Image

        from resdecay.commands.shard import run_shard

        rng = np.random.default_rng(3)
        for split, n in (("train", 64), ("val", 5)):
            for cls in ("cat", "dog"):
                (folder := self.root / "brace_folder" / split / cls).mkdir(parents=True)
                for i in range(n):
                    Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")
        written = run_shard(str(self.root / "brace_folder"), str(self.root / "brace_shards"), shard_size=1, progress=False)
        assert [len(written[s]) for s in ("train", "val")] == [128, 10], written
        return self.root / "brace_shards"

    @cached_property
    def hf_folder(self) -> Path:  # a datasets folder (save_to_disk) whose columns are named img and cls
        import datasets

        from resdecay.data.hf_export import save_hf_dataset

        dd = datasets.load_from_disk(str(save_hf_dataset("digits", self.root / "hf_digits", limit=48)))
        dd.rename_columns({"image": "img", "label": "cls"}).save_to_disk(str(self.root / "in100-hf"))
        return self.root / "in100-hf"

    @cached_property
    def vitmae(self) -> Path:  # a transformers ViTMAEForPreTraining folder (config.json + model.safetensors), RGB
        from helpers.interop import resdecay_checkpoint

        resdecay_checkpoint(self.root / "vitmae_src.pt", "mae-tiny-digits-plain", ["model.in_chans=3"])
        assert main(["export", str(self.root / "vitmae_src.pt"), "--to", "hf-vitmae", "--out", str(self.root / "vit-mae")]) == 0
        return self.root / "vit-mae"


def only_checkpoint(run: Path) -> Path:
    (ckpt,) = sorted(run.glob("checkpoints/step_*.pt"))
    return ckpt
