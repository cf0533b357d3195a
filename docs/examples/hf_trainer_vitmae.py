"""docs/plug-and-play.md, "Training in the library's own loop" (a): a Hugging Face ``ViTMAEForPreTraining``
made the paper's U-Net MAE (decayed encoder shortcuts + encoder->decoder long skips) by one resdecay call,
trained by transformers' own ``Trainer``, saved with ``trainer.save_model`` and reloaded by transformers'
own ``ViTMAEForPreTraining.from_pretrained`` plus one resdecay call.

The smallest sizes, on scikit-learn's embedded digits (8x8 grey, upsampled to 16x16 and repeated to 3
channels; nothing is downloaded): a 4-layer encoder (width 32) and a 2-layer decoder, 4x4 patches, 75 %
masking. ``resdecay.interop.hf_unet.unet_skips`` swaps no class and renames no key: the decay is hooks,
the skips are new parameters under ``model.resdecay_unet.``, so the Trainer, its optimizer, ``save_model``
and ``from_pretrained`` handle the library's own model. The settings travel in config.json as
``model.config.resdecay`` (PretrainedConfig serialises extra attributes); after ``from_pretrained``,
``restore(model, folder)`` re-applies them and loads the skip weights.

    python docs/examples/hf_trainer_vitmae.py --steps 60 --out runs/hf-trainer-vitmae --seed 0

prints a (step, loss) table, the mean loss of the first and last 5 steps, and whether the reloaded model
gives the trained model's outputs for the same masking noise and the same alpha table (exit status 1 if not).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

ALPHA_MIN = 0.6  # the factor of the encoder's last residual add (the decoder stays plain, as the paper's)


class _OneLineParser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str):  # noqa: D401
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None, prog: str = "hf_trainer_vitmae.py", doc: str = __doc__,
               out: str = "runs/hf-trainer-vitmae") -> argparse.Namespace:
    """The arguments of a Trainer example (this one's, and hf_trainer_clip.py's with its ``prog``, ``doc``, ``out``)."""
    p = _OneLineParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60, help="optimizer steps (at least 10)")
    p.add_argument("--out", default=out, help="output folder (Trainer's output_dir; the model is saved in OUT/model)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, the masking and the data order")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate")
    p.add_argument("--batch-size", type=int, default=32, help="examples per step")
    a = p.parse_args(argv)
    if a.steps < 10:
        p.error(f"--steps must be at least 10 (the table compares the first and last 5 steps), got {a.steps}")
    if not 0 <= a.seed < 2**32:
        p.error(f"--seed must lie in [0, 2**32), got {a.seed}")
    if a.batch_size < 1:
        p.error(f"--batch-size must be at least 1, got {a.batch_size}")
    if Path(a.out).exists() and not Path(a.out).is_dir():
        p.error(f"--out {a.out} is a file; give a folder")
    return a


def digits(size: int = 16):
    """scikit-learn's digits as (N, 3, size, size) float images, standardised (mean 0, std 1), and labels."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)
    return (x - x.mean()) / x.std(), torch.tensor(d.target)


def build_model(seed: int, alpha_min: float = ALPHA_MIN):
    """The smallest ViTMAEForPreTraining for 16x16 images, made the paper's U-Net MAE by one resdecay call:
    ``unet_skips`` decays the encoder (``decayify(model.vit, alpha_min)``; the decoder stays plain, as the
    paper's) and adds the encoder->decoder long skips (new parameters under ``model.resdecay_unet.``). It
    records both in ``model.config.resdecay``, which ``save_pretrained`` writes into config.json."""
    import torch
    from transformers import ViTMAEConfig, ViTMAEForPreTraining

    from resdecay.interop.hf_unet import unet_skips

    torch.manual_seed(seed)
    config = ViTMAEConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=4,
                          num_attention_heads=2, intermediate_size=64, decoder_hidden_size=32,
                          decoder_num_hidden_layers=2, decoder_num_attention_heads=2, decoder_intermediate_size=64,
                          mask_ratio=0.75, layer_norm_eps=1e-6)
    model = ViTMAEForPreTraining(config)
    with warnings.catch_warnings():  # transformers 5.x builds it with zero position tables: unet_skips fills them
        warnings.simplefilter("ignore")
        return unet_skips(model, alpha_min=alpha_min)


def reload(folder: str | Path):
    """transformers' own from_pretrained (it leaves the ``resdecay_unet.`` weights aside as unexpected keys),
    then one resdecay call: ``restore`` re-applies the decay and skips recorded in config.json and loads
    the skip weights from the folder."""
    from transformers import ViTMAEForPreTraining

    from resdecay.interop.hf_unet import restore

    model = ViTMAEForPreTraining.from_pretrained(folder)
    return restore(model, folder).eval()


def _alphas(table) -> str:
    """'1 .. 0.6' style: every add's factor of a decayed model, two decimals."""
    return " ".join(f"{a:.2f}" for _, pair in table for a in pair)


def table_trainer(model, dataset, args):
    """transformers' ``Trainer`` on ``dataset`` (CPU, AdamW, warm-up + cosine, every step logged, nothing saved
    until ``save_model``), printing (step, loss) as it logs: every step is logged, every tenth is printed."""
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    every = max(1, args.steps // 10)

    class Table(TrainerCallback):
        def on_log(self, _args, state, _control, logs=None, **kw):
            step = state.global_step
            if logs and "loss" in logs and (step == 1 or step % every == 0 or step == args.steps):
                print(f"{step:>5d}  {logs['loss']:.4f}", flush=True)

    targs = TrainingArguments(output_dir=str(args.out), report_to=[], use_cpu=True, max_steps=args.steps,
                              per_device_train_batch_size=args.batch_size, learning_rate=args.lr, weight_decay=0.05,
                              warmup_steps=max(1, args.steps // 10), lr_scheduler_type="cosine", logging_steps=1,
                              save_strategy="no", seed=args.seed, dataloader_num_workers=0,
                              disable_tqdm=True, log_level="error")
    trainer = Trainer(model=model, args=targs, train_dataset=dataset, callbacks=[Table()])
    trainer.remove_callback(PrinterCallback)  # the table replaces the Trainer's own dict lines
    return trainer


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch
    from torch.utils.data import Dataset
    from transformers.utils import logging as hf_logging

    import resdecay

    torch.set_num_threads(min(2, torch.get_num_threads()))
    hf_logging.disable_progress_bar()  # no 'Writing model shards' / 'Loading weights' bars
    images, _ = digits(16)

    class Digits(Dataset):
        def __len__(self):
            return len(images)

        def __getitem__(self, i):
            return {"pixel_values": images[i]}

    model = build_model(args.seed)
    out = Path(args.out)
    trainer = table_trainer(model, Digits(), args)
    unet = next(s for s in model.config.resdecay["steps"] if s["op"] == "unet_skips")  # what save_pretrained keeps
    print(f"ViTMAEForPreTraining + unet_skips(alpha_min={ALPHA_MIN}): encoder alphas "
          f"{_alphas(resdecay.alphas_of(model.vit))}, skips from encoder layers {unet['skip_sources']}, "
          f"decoder start {unet['decoder_start']}; {sum(p.numel() for p in model.parameters())} parameters "
          f"({sum(p.numel() for p in model.resdecay_unet.parameters())} under resdecay_unet.); "
          f"{len(images)} digits 16x16")
    print(" step  loss")
    trainer.train()
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]

    folder = out / "model"
    trainer.save_model(str(folder))  # save_pretrained: config.json (with config.resdecay) + model.safetensors

    model.eval()
    g = torch.Generator().manual_seed(args.seed + 1)
    x = images[:8]
    noise = torch.rand(len(x), model.vit.embeddings.patch_embeddings.num_patches, generator=g)
    with torch.no_grad():
        before = model(pixel_values=x, noise=noise).logits
        reloaded = reload(folder)
        after = reloaded(pixel_values=x, noise=noise).logits
    same = torch.equal(before, after)
    alphas_same = resdecay.alphas_of(reloaded) == resdecay.alphas_of(model)
    skips_same = all(torch.equal(a, b) for a, b in zip(model.resdecay_unet.state_dict().values(),
                                                        reloaded.resdecay_unet.state_dict().values(), strict=True))
    first = sum(v for _, v in losses[:5]) / len(losses[:5])
    last = sum(v for _, v in losses[-5:]) / len(losses[-5:])
    print(f"loss: first 5 steps {first:.4f}, last 5 steps {last:.4f}")
    print(f"saved {folder}; ViTMAEForPreTraining.from_pretrained + restore: outputs for the same noise "
          f"{'identical' if same else 'DIFFERENT (max |diff| %.3g)' % (before - after).abs().max()}, alphas "
          f"{'identical' if alphas_same else 'DIFFERENT'}, skip weights "
          f"{'identical' if skips_same else 'DIFFERENT'}")
    return {"losses": losses, "model": model, "reloaded": reloaded, "folder": folder, "images": images,
            "same_outputs": same, "same_alphas": alphas_same and skips_same}


if __name__ == "__main__":
    r = main()
    sys.exit(0 if r["same_outputs"] and r["same_alphas"] else 1)
