"""docs/plug-and-play.md, "Training in the library's own loop" (c): a Hugging Face CLIP vision tower
(``CLIPForImageClassification``: CLIP's ``CLIPVisionTransformer`` and a linear head) decayified by one resdecay
call, trained by transformers' own ``Trainer``, saved with ``trainer.save_model`` and reloaded by transformers'
own ``from_pretrained`` plus one resdecay call.

The smallest sizes, on scikit-learn's embedded digits (the ViTMAE example's: 8x8 grey upsampled to 16x16, 3
channels; nothing is downloaded): 4 encoder layers of width 32, 4x4 patches, the 10 digit classes.
``decayify(model, alpha_min, zero_init=True)`` hooks the tower's ``CLIPEncoderLayer``s (pre-hooks on
``layer_norm1/2``, corrections on ``self_attn`` / ``mlp``) and zeroes each branch's last layer (the paper's
init): the Trainer, its optimizer, ``save_model`` and ``from_pretrained`` handle the library's own model, and
the decay travels in config.json (``model.config.resdecay``), which ``resdecay.interop.restore`` re-applies.

    python docs/examples/hf_trainer_clip.py --steps 60 --out runs/hf-trainer-clip --seed 0

prints a (step, loss) table, the mean loss of the first and last 5 steps, the train accuracy, and whether the
reloaded model gives the trained model's logits and alpha table (exit status 1 if not).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_trainer_vitmae import digits, table_trainer  # noqa: E402  (the same data, loop and arguments)
from hf_trainer_vitmae import parse_args as trainer_args  # noqa: E402

ALPHA_MIN = 0.6  # the factor of the tower's last residual add


def parse_args(argv: list[str] | None = None):
    return trainer_args(argv, prog="hf_trainer_clip.py", doc=__doc__, out="runs/hf-trainer-clip")


def build_model(seed: int, alpha_min: float = ALPHA_MIN):
    """The smallest CLIP vision tower with a 10-way head, decayified with the paper's zero init."""
    import torch
    from transformers import CLIPConfig, CLIPForImageClassification

    import resdecay

    torch.manual_seed(seed)
    vision = dict(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=4,
                  num_attention_heads=2, intermediate_size=64)
    config = CLIPConfig(vision_config=vision, text_config=dict(hidden_size=32, num_hidden_layers=1,
                                                                num_attention_heads=2, intermediate_size=64),
                        num_labels=10)
    model = CLIPForImageClassification(config)
    return resdecay.decayify(model, alpha_min=alpha_min, zero_init=True)


def reload(folder: str | Path):
    """transformers' own from_pretrained (it reads config.resdecay without acting on it), then ``restore``."""
    from transformers import CLIPForImageClassification

    from resdecay.interop import restore

    return restore(CLIPForImageClassification.from_pretrained(folder)).eval()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch
    from torch.utils.data import Dataset
    from transformers.utils import logging as hf_logging

    import resdecay

    torch.set_num_threads(min(2, torch.get_num_threads()))
    hf_logging.disable_progress_bar()
    images, labels = digits(16)

    class Digits(Dataset):
        def __len__(self):
            return len(images)

        def __getitem__(self, i):
            return {"pixel_values": images[i], "labels": labels[i]}

    model = build_model(args.seed)
    out = Path(args.out)
    trainer = table_trainer(model, Digits(), args)
    table = resdecay.alphas_of(model)
    print(f"CLIPForImageClassification, decayify(alpha_min={ALPHA_MIN}, zero_init=True): {len(table)} CLIPEncoderLayers, "
          f"alphas {' '.join(f'{a:.2f}' for _, pair in table for a in pair)}; "
          f"{sum(p.numel() for p in model.parameters())} parameters; {len(images)} digits 16x16")
    print(" step  loss")
    trainer.train()
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    folder = out / "model"
    trainer.save_model(str(folder))

    model.eval()
    with torch.no_grad():
        before = model(pixel_values=images).logits
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # from_pretrained's notes on the text tower it does not use
            reloaded = reload(folder)
        after = reloaded(pixel_values=images).logits
    same = torch.equal(before, after)
    alphas_same = resdecay.alphas_of(reloaded) == table
    accuracy = (before.argmax(1) == labels).float().mean().item()
    first = sum(v for _, v in losses[:5]) / len(losses[:5])
    last = sum(v for _, v in losses[-5:]) / len(losses[-5:])
    print(f"loss: first 5 steps {first:.4f}, last 5 steps {last:.4f}; train accuracy {accuracy:.3f} "
          f"(1,797 digits, 10 classes)")
    print(f"saved {folder}; CLIPForImageClassification.from_pretrained + restore: logits "
          f"{'identical' if same else 'DIFFERENT (max |diff| %.3g)' % (before - after).abs().max()}, alphas "
          f"{'identical' if alphas_same else 'DIFFERENT'}")
    return {"losses": losses, "model": model, "reloaded": reloaded, "folder": folder, "accuracy": accuracy,
            "same_outputs": same, "same_alphas": alphas_same}


if __name__ == "__main__":
    r = main()
    sys.exit(0 if r["same_outputs"] and r["same_alphas"] else 1)
