"""Small models and checkpoints for the interop tests (built here, nothing downloaded)."""

import re

import timm
import torch

from helpers import model_overrides, tiny_config
from resdecay.interop.hf_unet import fill_zero_positions
from resdecay.io import atomic_save
from resdecay.models import build_model
from resdecay.train.checkpoint import FORMAT
from resdecay.train.config import load_config

SMALL = model_overrides("mae")  # the preset's model at the tiny MAE's widths and depths


def resdecay_checkpoint(path, preset="mae-tiny-digits", overrides=(), randomise=True, seed=0):
    """A resdecay checkpoint written without training: the preset's model with random weights
    (zero-initialised layers filled too, so every weight matters in a comparison)."""
    torch.manual_seed(seed)
    cfg = load_config(preset, [*SMALL, *overrides])
    model = build_model(cfg.model)
    if randomise:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() > 1 or name.endswith("bias"):
                    p.add_(torch.randn_like(p) * 0.05)
    atomic_save({"format": FORMAT, "model": model.state_dict(), "config": cfg.to_dict(),
                 "train_state": {"step": 0, "epoch": 0, "step_in_epoch": 0}}, path)
    return model.eval(), cfg


def tiny_timm(seed=0, **kw):
    torch.manual_seed(seed)
    args = {"pretrained": False, "img_size": 32, "patch_size": 8, "depth": 4, **kw}
    model = timm.create_model("vit_tiny_patch16_224", **args).eval()
    with torch.no_grad():  # timm zero-inits the head and its biases; make them matter
        for name, p in model.named_parameters():
            if name.startswith("head") or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.05)
    return model


def timm_blocks(vit, x):
    """timm's raw last-block tokens (cls first, before the final norm): what resdecay calls features."""
    t = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))
    for blk in vit.blocks:
        t = blk(t)
    return t


def authors_unet_layout(state):
    """A resdecay U-Net MAE state_dict under the authors' key names (``skip.{i}.fc.0`` ...)."""
    theirs = {"fc1": "fc.0", "fc2": "fc.2"}
    out = {}
    for key, value in state.items():
        m = re.match(r"skip_fusions\.(\d+)\.(fc1|fc2|mask_token)(.*)$", key)
        out[f"skip.{m[1]}.{theirs.get(m[2], m[2])}{m[3]}" if m else key] = value
    return out


DIGITS = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(2))


def same_mae_outputs(a, b, imgs=DIGITS):
    """Loss, predictions and mask of two MAEs under the same random mask."""
    with torch.no_grad():
        torch.manual_seed(7)
        la, pa, ma = a(imgs)
        torch.manual_seed(7)
        lb, pb, mb = b(imgs)
    return torch.equal(ma, mb) and torch.allclose(pa, pb, atol=1e-6) and torch.allclose(la, lb, atol=1e-6)


# the tiny MAE (16x16 RGB, 4 blocks of width 32) with a decoder narrower than its encoder, so that a mixed-up
# width would fail; hf_model below is built to the same sizes
TINY_UNET = tiny_config("mae", decoder_embed_dim=24)


def hf_model(zero_positions: bool = False, **extra):
    """The tiny ViTMAE with its sin-cos tables, as from_pretrained gives it (``zero_positions``: as a
    model built from a config in transformers 5.x has them)."""
    from transformers import ViTMAEConfig, ViTMAEForPreTraining
    t = TINY_UNET
    cfg = ViTMAEConfig(hidden_size=t.embed_dim, num_hidden_layers=t.depth, num_attention_heads=t.num_heads,
                       intermediate_size=int(t.embed_dim * t.mlp_ratio), image_size=t.img_size, patch_size=t.patch_size,
                       num_channels=t.in_chans, decoder_hidden_size=t.decoder_embed_dim,
                       decoder_num_hidden_layers=t.decoder_depth, decoder_num_attention_heads=t.decoder_num_heads,
                       decoder_intermediate_size=int(t.decoder_embed_dim * t.mlp_ratio), layer_norm_eps=1e-6,
                       mask_ratio=0.75, norm_pix_loss=True, **extra)
    torch.manual_seed(0)
    model = ViTMAEForPreTraining(cfg).eval()
    with torch.no_grad():
        model.decoder.decoder_pos_embed.zero_()
        model.vit.embeddings.position_embeddings.zero_()
    if not zero_positions:
        fill_zero_positions(model)
    return model
