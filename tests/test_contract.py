"""The model contract, checked for every registered family at its tiny size; every shipped preset
loads and builds; regression tests for bugs the reorganisation fixed."""

from __future__ import annotations

import json
import re
from dataclasses import asdict

import pytest
import torch

from resdecay.errors import ConfigError
from resdecay.models import FAMILIES, build_model, is_diffusion, tiny_config
from resdecay.train import checkpoint as ckpt
from resdecay.train.config import from_dict, list_presets, load_config


def _inputs(model, family: str, batch: int = 3):
    cfg = model.cfg if family != "classifier" else model.cfg  # the classifier's cfg is its encoder's
    x = torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size)
    labels = torch.arange(batch) % 2
    if is_diffusion(family):
        return x, {"t": torch.rand(batch) * 999, "y": labels}, labels
    return x, {}, labels


def _loss(model, family: str, x, cond, labels) -> torch.Tensor:
    if family == "mae":
        return model(x)[0]
    if is_diffusion(family):
        return model(x, cond["t"], cond["y"]).float().pow(2).mean()
    return model(x, labels)[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_contract(family):
    torch.manual_seed(0)
    model = build_model(tiny_config(family))
    x, cond, labels = _inputs(model, family)
    # forward on CPU, no NaN, every trainable parameter gets a gradient
    model.train()
    loss = _loss(model, family, x, cond, labels)
    assert torch.isfinite(loss)
    loss.backward()
    # zero-initialised last layers give zero gradients to what feeds them on the first step; a
    # parameter "gets a gradient" when autograd reaches it (grad is not None)
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing
    # forward_intermediates: the requested blocks, refusing out-of-range ones with one clear line
    model.eval()
    depth = len(model.blocks)
    with torch.no_grad():
        feats = model.forward_intermediates(x, **cond, indices=[0, -1])
        assert len(feats) == 2 and all(torch.isfinite(f).all() for f in feats)
        assert torch.equal(feats[1], model.forward_intermediates(x, **cond)[0])  # default: the last block
        for bad in ([depth], [-depth - 1], [100]):
            with pytest.raises(IndexError, match=re.escape(f"0..{depth - 1}")) as e:
                model.forward_intermediates(x, **cond, indices=bad)
            assert "\n" not in str(e.value)
    # state_dict round-trips into a fresh model of the same config
    other = build_model(tiny_config(family)).eval()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        a = model.forward_intermediates(x, **cond, indices=[-1])[0]
        b = other.forward_intermediates(x, **cond, indices=[-1])[0]
    assert torch.equal(a, b)
    assert model.flops_per_sample() > 0 and model.alphas.shape[0] == depth


def test_resnet_refuses_out_of_range_blocks():
    """Regression: block 100 of a SupervisedResNet used to wrap silently to block 100 % depth."""
    model = build_model(tiny_config("resnet")).eval()
    with pytest.raises(IndexError, match="out of range"):
        model.forward_intermediates(torch.randn(1, 3, 16, 16), [100])


def test_uvit_accepts_scaled_linear_noise_schedule():
    """Regression: U-ViT/SiT configs kept their own shorter list of noise schedules."""
    cfg = load_config("uvit-tiny-fmnist", ["model.noise_schedule=scaled-linear"])
    assert cfg.model.noise_schedule == "scaled-linear"
    build_model(cfg.model)
    with pytest.raises(ConfigError, match="choose one of linear, cosine, scaled-linear"):
        load_config("uvit-tiny-fmnist", ["model.noise_schedule=sigmoid"])


@pytest.mark.parametrize("name", list_presets())
def test_every_shipped_preset_loads_and_builds(name):
    # reads the shipped YAML (and its base); fine-tuning recipes get a pretrained encoder's config
    # the way `resdecay finetune` gives it, as a model.encoder override
    extra = [f"model.encoder={json.dumps(asdict(tiny_config('mae')))}"] if "finetune" in name or "linprobe" in name else []
    cfg = load_config(name, extra)
    with torch.device("meta"):  # build the structure without allocating ViT-L / SiT-XL weights
        model = build_model(cfg.model)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_checkpoint_written_before_the_reorganisation_loads(tmp_path):
    """A checkpoint holds only tensors and a resolved config dict (no pickled classes), so the old
    format loads unchanged; this one is built from the dict the old code wrote."""
    old_config = {"preset": "mae-tiny-digits",
                  "model": {"family": "mae", "img_size": 8, "in_chans": 1, "patch_size": 2, "embed_dim": 32, "depth": 4,
                            "num_heads": 2, "mlp_ratio": 4.0, "decoder_embed_dim": 32, "decoder_depth": 2,
                            "decoder_num_heads": 2, "alpha_min": 0.6, "schedule": "linear", "shortcut": "decay",
                            "decay_branches": "both", "decoder_decay": False, "skips": True, "skip_sources": None,
                            "zero_init": True, "encoder_norm": False, "mask_ratio": 0.75, "norm_pix_loss": True},
                  "data": {"name": "digits", "path": None, "augment": "none", "num_workers": 0, "train_subset": None,
                           "resize": False, "normalize": "dataset", "canvas": 32,
                           "nuisances": ["background", "colour", "scale", "position"], "dataset_seed": 0},
                  "train": {"epochs": 2, "warmup_epochs": 1, "batch_size": 64, "accum_steps": 1, "base_lr": 1.5e-4,
                            "lr": None, "min_lr": 0.0, "lr_schedule": "cosine", "ema_decay": 0.0, "ema_warmup": False,
                            "weight_decay": 0.05, "beta1": 0.9, "beta2": 0.95, "optimizer": "adamw", "grad_clip": None,
                            "seed": 0, "device": "auto", "precision": "auto", "compile": False, "ckpt_every": 500,
                            "keep_last": 2, "log_every": 10, "out_dir": None, "threads": None, "online_eval_every": 0,
                            "online_eval_size": 2000}}
    torch.manual_seed(0)
    weights = build_model(from_dict(old_config).model).state_dict()
    state = {"format": "resdecay-checkpoint-v1", "model": weights, "optimizer": {}, "scaler": {},
             "train_state": {"step": 3, "epoch": 0, "step_in_epoch": 3, "world_size": 1}, "rng": [], "config": old_config}
    torch.save(state, tmp_path / "step_00000003.pt")
    model, cfg = ckpt.load_model(tmp_path / "step_00000003.pt")
    new = cfg.to_dict()  # every old key keeps its value; keys added since take their defaults
    assert all(new[s][k] == v for s in ("model", "data", "train") for k, v in old_config[s].items())
    assert {k: v for k, v in new["data"].items() if k not in old_config["data"]} == {"on_bad_file": "stop", "decoder": "tensor"}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_contract_on_cuda_in_bf16(family):
    """The same contract on a GPU under bf16 autocast (the trainer's default there)."""
    torch.manual_seed(0)
    model = build_model(tiny_config(family)).cuda()
    x, cond, labels = _inputs(model, family)
    x, labels = x.cuda(), labels.cuda()
    cond = {k: v.cuda() for k, v in cond.items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = _loss(model, family, x, cond, labels)
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
