"""The model contract, checked for every registered family at its tiny size; every shipped preset
loads and builds; regression tests for bugs the reorganisation fixed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from resdecay.cli.plugins import load_plugins
from resdecay.errors import ConfigError, RegistryError
from resdecay.models import (
    FAMILIES,
    MAEConfig,
    ModelConfig,
    ResidualModel,
    build_model,
    get_family,
    register_family,
    tiny_config,
)
from resdecay.models.contract import missing_members
from resdecay.train import checkpoint as ckpt
from resdecay.train.config import from_dict, list_presets, load_config

MIXER = Path(__file__).parent.parent.parent / "docs" / "examples" / "extending" / "mixer.py"  # docs/EXTENDING.md (b)


# RESDECAY_PLUGINS=my_family.py pytest tests/models/test_contract.py: a family registered in a user's own
# file is checked by this unchanged test, as the CLI would load it
load_plugins([])


def _tiny(family: str, overrides: dict):
    cfg = tiny_config(family)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def check_contract(family: str, **overrides) -> None:
    """The model contract for one registered family at its tiny size (with ``overrides`` of its config);
    everything family-specific (its tiny size, what its forward takes, its loss) comes from its registration."""
    spec = get_family(family)
    torch.manual_seed(0)
    cfg = _tiny(family, overrides)
    assert isinstance(cfg, ModelConfig) and isinstance(cfg.warnings(), list)
    model = build_model(cfg)
    assert isinstance(model, ResidualModel), f"{family} lacks {missing_members(model)}"
    assert isinstance(model.cfg, ModelConfig) and (model.cfg.img_size, model.cfg.in_chans) == (cfg.img_size, cfg.in_chans)
    batch = spec.example_batch(model, 3)
    x, cond = batch.images, batch.conditioning
    # the registered objective on CPU, no NaN, every trainable parameter gets a gradient
    model.train()
    loss = spec.objective(model, x, batch.labels)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    # zero-initialised last layers give zero gradients to what feeds them on the first step; a
    # parameter "gets a gradient" when autograd reaches it (grad is not None)
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing
    # forward_intermediates: the requested blocks, refusing out-of-range ones with one clear line
    model.eval()
    depth = model.num_blocks
    assert depth == len(model.blocks) == cfg.num_blocks > 0
    assert isinstance(model.blocks, nn.ModuleList) and isinstance(model.decoder_blocks, nn.ModuleList)
    with torch.no_grad():
        feats = model.forward_intermediates(x, *cond, indices=[0, -1])
        assert len(feats) == 2 and all(torch.isfinite(f).all() for f in feats)
        assert torch.equal(feats[1], model.forward_intermediates(x, *cond)[0])  # default: the last block
        assert torch.equal(feats[1], model.forward_features(x, *cond))  # the features evaluation pools
        for bad in ([depth], [-depth - 1], [100]):
            with pytest.raises(IndexError, match=re.escape(f"0..{depth - 1}")) as e:
                model.forward_intermediates(x, *cond, indices=bad)
            assert "\n" not in str(e.value)
    # state_dict round-trips into a fresh model of the same config
    other = build_model(_tiny(family, overrides)).eval()
    other.load_state_dict(model.state_dict())
    with torch.no_grad():
        a = model.forward_intermediates(x, *cond, indices=[-1])[0]
        b = other.forward_intermediates(x, *cond, indices=[-1])[0]
    assert torch.equal(a, b)
    assert model.flops_per_sample() > 0 and model.alphas.shape[0] == depth


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_contract(family):
    check_contract(family)


@pytest.mark.parametrize("family", ["mae", "sit", "uvit"])
@pytest.mark.parametrize("variant", ["hc", "mhc"])
def test_model_contract_with_hyper_connections(family, variant):
    check_contract(family, hyper_streams=2, hyper_variant=variant)  # nn.hyper: n residual streams, reduced reads


def test_a_family_registered_in_a_users_file_is_checked_unchanged(tmp_path):
    """The contract test picks up a family registered outside the package (docs/examples/extending/mixer.py,
    loaded as the CLI loads --plugin files) without an edit: it runs as one more parametrised case."""
    env = {**os.environ, "RESDECAY_PLUGINS": str(MIXER), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                           "test_model_contract and mixer"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout + proc.stderr


def test_a_broken_registration_is_one_line():
    with pytest.raises(RegistryError, match="already registered .*register yours under another name"):
        register_family("mae", config=MAEConfig, objective=lambda m, x, y: m(x)[0], build=lambda cfg: None)
    with pytest.raises(RegistryError, match="needs a field `family: str = 'mae2'`"):
        register_family("mae2", config=MAEConfig, objective=lambda m, x, y: m(x)[0], build=lambda cfg: None)
    with pytest.raises(RegistryError, match="must be a dataclass subclassing resdecay.models.ModelConfig"):
        register_family("plain", config=dict, objective=lambda m, x, y: m(x)[0], build=lambda cfg: None)
    assert "mae2" not in FAMILIES and "plain" not in FAMILIES


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
    assert {k: v for k, v in new["data"].items() if k not in old_config["data"]} == {
        "on_bad_file": "stop", "decoder": "tensor", "subset_seed": 0, "val_path": None, "image_column": "image",
        "label_column": "label", "composition": "photos"}
    assert {k: v for k, v in new["model"].items() if k not in old_config["model"]} == {
        "grad_checkpointing": False, "branch_scale": "none", "layerscale_init": 1e-5, "drop_branch": 0.0,
        "drop_identity": 0.0, "hyper_streams": 1, "hyper_variant": "hc"}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in weights.items())


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_model_contract_on_cuda_in_bf16(family):
    """The same contract on a GPU under bf16 autocast (the trainer's default there)."""
    torch.manual_seed(0)
    spec = get_family(family)
    model = build_model(tiny_config(family)).cuda()
    batch = spec.example_batch(model, 3)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = spec.objective(model, batch.images.cuda(), batch.labels.cuda())
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
