import re

import pytest

from resdecay.errors import ConfigError
from resdecay.train.config import list_presets, load_config, parse_overrides

EXPECTED = {"mae-tiny-digits", "mae-tiny-fmnist", "mae-s16", "mae-b16", "mae-l16"}


RECIPES = {"finetune-mae", "linprobe-mae"}  # applied to a checkpoint by `resdecay finetune`


def test_every_preset_and_its_plain_form_exist_and_load():
    names = set(list_presets())
    assert EXPECTED | {f"{n}-plain" for n in EXPECTED} | RECIPES <= names
    assert {"resnet18-cifar10", "resnet18-cifar100", "resnet18-fmnist"} <= names
    assert {"uvit-tiny-fmnist", "uvit-s2", "uvit-m2", "sit-tiny-fmnist", "sit-s2", "sit-b2", "sit-xl2"} <= names
    for name in names - RECIPES:
        cfg = load_config(name)
        assert cfg.preset == name and cfg.model.family == name.split("-")[0].replace("resnet18", "resnet")


@pytest.mark.parametrize("override,message", [
    ("data.normalize=x", "data.normalize 'x' is unknown"),
    ("train.lr_schedule=x", "train.lr_schedule 'x' is unknown"),
    ("train.ema_decay=1.5", "train.ema_decay must lie in [0, 1)"),
    ("model.depth=6", "must be odd and >= 3 for U-ViT"),
    ("model.objective=x", "model.objective 'x' is unknown"),
])
def test_new_diffusion_and_training_keys_are_checked(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config("uvit-tiny-fmnist", [override]).validate()


def test_diffusion_plain_presets_switch_off_decay_and_skips():
    for n in ("uvit-tiny-fmnist", "sit-tiny-fmnist"):
        decayed, plain = load_config(n), load_config(f"{n}-plain")
        assert decayed.model.alpha_min < 1 and decayed.model.skips
        assert plain.model.alpha_min == 1.0 and not plain.model.skips


def test_recipe_presets_need_a_checkpoint():
    with pytest.raises(ConfigError, match="model.encoder is empty: build classifiers with `resdecay finetune CHECKPOINT`"):
        load_config("finetune-mae")


def test_plain_presets_are_the_baseline_switches():
    for n in EXPECTED:
        decayed, plain = load_config(n), load_config(f"{n}-plain")
        assert decayed.model.alpha_min < 1 and decayed.model.skips and decayed.model.zero_init
        assert plain.model.alpha_min == 1.0 and not plain.model.skips and not plain.model.zero_init and plain.model.encoder_norm
        assert plain.model.embed_dim == decayed.model.embed_dim and plain.train == decayed.train


def test_imagenet_recipe():
    cfg = load_config("mae-b16")
    assert (cfg.model.embed_dim, cfg.model.depth, cfg.model.decoder_embed_dim, cfg.model.decoder_depth) == (768, 12, 512, 8)
    t = cfg.train
    assert (t.base_lr, t.weight_decay, t.beta1, t.beta2, t.epochs, t.warmup_epochs) == (1.5e-4, 0.05, 0.9, 0.95, 800, 40)
    assert cfg.data.augment == "mae" and cfg.model.mask_ratio == 0.75 and cfg.model.norm_pix_loss


def test_overrides_dotted_bare_and_typed():
    cfg = load_config("mae-tiny-digits", ["alpha_min=0.7", "train.epochs=3", "schedule=cosine", "skip_sources=[11, 5]",
                                          "lr=0.001", "data.train_subset=100"])
    assert cfg.model.alpha_min == 0.7 and cfg.train.epochs == 3 and cfg.model.schedule == "cosine"
    assert cfg.model.skip_sources == [11, 5] and cfg.train.lr == 0.001 and cfg.data.train_subset == 100
    assert isinstance(load_config("mae-tiny-digits", ["alpha_min=1"]).model.alpha_min, float)


@pytest.mark.parametrize("overrides,match", [
    (["alpha_min=1.5"], r"alpha_min must lie in \(0, 1\]"),
    (["alpha_min=0"], r"alpha_min must lie in \(0, 1\]"),
    (["alpha_minn=0.5"], "is not a setting; valid keys:.*model.alpha_min"),
    (["model.bogus=1"], "valid model keys:.*alpha_min"),
    (["optim.lr=1"], "section 'optim' does not exist"),
    (["epochs"], "not key=value"),
    (["train.batch_size=0"], "batch_size must be a positive integer"),
    (["train.batch_size=-4"], "batch_size must be a positive integer"),
    (["train.epochs=0"], "epochs must be a positive integer"),
    (["train.epochs=ten"], "must be an integer"),
    (["skips=maybe"], "must be true or false"),
    (["model.schedule=sigmoid"], "schedule 'sigmoid' is unknown"),
    (["model.patch_size=3"], "image size 8 is not divisible by patch size 3"),
    (["data.name=mnist"], "data.name 'mnist' is unknown"),
])
def test_bad_values_give_one_clear_error(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("mae-tiny-digits", overrides)


def test_unknown_preset_lists_valid_ones():
    with pytest.raises(ConfigError, match="preset 'mae-huge' does not exist; valid presets: .*mae-b16"):
        load_config("mae-huge")


def test_preset_from_yaml_file(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("base: mae-tiny-digits\nmodel:\n  alpha_min: 0.8\n")
    cfg = load_config(str(f))
    assert cfg.model.alpha_min == 0.8 and cfg.preset == "mine" and cfg.model.depth == 12


def test_parse_overrides_sections():
    assert parse_overrides(["depth=6", "train.seed=3"], "mae") == {"model": {"depth": 6}, "train": {"seed": 3}}


@pytest.mark.parametrize("text,fragments", [
    ("model: {depth: [1, 2\n", ["is not valid YAML", "line 2, column 1", "fix the file"]),
    ("model:\n  depth: 3\n   x: 4\n", ["is not valid YAML: mapping values are not allowed here at line 3"]),
    ("train: !!python/object/apply:os.system ['echo never-run']\n",
     ["the tag !!python/object/apply:os.system at line 1, column 8 is refused", "safe loader", "remove the tag"]),
    ("- 1\n- 2\n", ["must be a mapping of sections (model:, data:, train:), got list"]),
    ("train: 5\n", ["section 'train' must be a mapping of settings, got 5"]),
])
def test_malformed_or_hostile_preset_files_are_one_line(capsys, tmp_path, text, fragments):
    """Issue 23.12: a malformed preset YAML ended in the parser's traceback, and one holding
    !!python/object/apply was refused as a traceback too."""
    from helpers import assert_one_line_error, run

    path = tmp_path / "preset.yaml"
    path.write_text(text)
    code, out, err = run(capsys, "pretrain", "--preset", str(path))
    assert_one_line_error(code, err, f"preset file {path}", *fragments)
    assert "never-run" not in out
