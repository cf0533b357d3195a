"""Issue 38, item 11: `resdecay pretrain --preset P --from SOURCE` continues MAE pretraining from imported weights,
with the sources `finetune --from` takes (resolved by the same code). The first step's loss is the source model's
loss on the same batch and masking noise (transformers' own ViTMAE for a Hugging Face folder, resdecay's model
for a resdecay run or the official MAE .pth); the run is fresh (step 0, a new optimizer) and records its source;
a source without a decoder or whose weights do not fit the preset is refused in one line naming the fix."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import assert_one_line_error, model_overrides, run
from helpers.interop import tiny_timm
from resdecay.cli import main
from resdecay.models.mae import MaskedAutoencoder
from resdecay.train.checkpoint import list_checkpoints, load_model

SIZE = model_overrides("mae")  # the tiny MAE's widths and depths; the digits presets' 8x8 images in 2x2 patches
RUN = [*SIZE, "train.epochs=1", "train.warmup_epochs=1", "train.batch_size=32", "train.log_every=1", "train.loggers=[]",
       "data.train_subset=320"]  # 10 steps an epoch
PLAIN, UNET = "mae-tiny-digits-plain", "mae-tiny-digits"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two trained sources (one epoch on digits): a plain MAE and a decayed U-Net MAE (alpha_min 0.6, skips)."""
    root = tmp_path_factory.mktemp("sources")
    for name, preset in (("plain", PLAIN), ("unet", UNET)):
        assert main(["pretrain", "--preset", preset, "--no-progress", "--out", str(root / name), *RUN,
                     "train.seed=5"]) == 0
    return root


@pytest.fixture
def first_forward(monkeypatch):
    """The images of the training's first forward and the RNG state it drew its masking noise from."""
    seen = {}
    forward = MaskedAutoencoder.forward

    def recording(self, imgs, mask_ratio=None):
        if not seen:
            seen.update(imgs=imgs.detach().clone(), rng=torch.get_rng_state())
        return forward(self, imgs, mask_ratio)

    monkeypatch.setattr(MaskedAutoencoder, "forward", recording)
    return seen


def loss_of(model, seen) -> float:
    """``model``'s MAE loss on the recorded batch with the recorded masking noise."""
    torch.set_rng_state(seen["rng"])
    with torch.no_grad():
        return model.train()(seen["imgs"])[0].item()


def log_rows(run_dir):
    return [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]


def newest(run_dir):
    return list_checkpoints(run_dir / "checkpoints")[-1]


def continued(capsys, out, preset, source, *extra):
    code, stdout, err = run(capsys, "pretrain", "--preset", preset, "--no-progress", "--out", out, "--from", source,
                            *RUN, *extra)
    assert code == 0, err
    return stdout


@pytest.mark.slow
def test_hf_vitmae_folder_first_loss_is_transformers_loss(capsys, tmp_path, sources, first_forward):
    transformers = pytest.importorskip("transformers")
    source_ckpt = newest(sources / "plain")
    assert run(capsys, "export", source_ckpt, "--to", "hf-vitmae", "--out", tmp_path / "hf")[0] == 0
    out = continued(capsys, tmp_path / "run", PLAIN, tmp_path / "hf")
    assert "continuing pretraining from" in out and "Hugging Face ViTMAE" in out and "note:" not in out
    first = log_rows(tmp_path / "run")[0]
    assert first["step"] == 1
    hf = transformers.ViTMAEForPreTraining.from_pretrained(tmp_path / "hf")
    imgs = first_forward["imgs"]
    torch.set_rng_state(first_forward["rng"])  # resdecay's first draw in forward is this noise
    noise = torch.rand(len(imgs), hf.config.image_size ** 2 // hf.config.patch_size ** 2)
    with torch.no_grad():
        hf_loss = hf.train()(imgs, noise=noise).loss.item()
    assert first["loss"] == pytest.approx(hf_loss, rel=1e-5)
    assert first["loss"] == pytest.approx(loss_of(load_model(source_ckpt)[0], first_forward), rel=1e-6)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["pretrained"]["format"] == "hf-vitmae" and summary["pretrained"]["sha256_of"] == "model.safetensors"
    assert summary["pretrained"] == json.loads((tmp_path / "run" / "pretrained.json").read_text())


@pytest.mark.slow
def test_official_mae_pth_first_loss_is_the_source_models(capsys, tmp_path, sources, first_forward):
    source, _ = load_model(newest(sources / "plain"))
    torch.save({"model": source.state_dict()}, tmp_path / "mae_pretrain.pth")  # facebookresearch/mae's layout
    heads = ["--import-override", "model.num_heads=2", "--import-override", "model.decoder_num_heads=2"]
    continued(capsys, tmp_path / "run", PLAIN, tmp_path / "mae_pretrain.pth", *heads)
    assert log_rows(tmp_path / "run")[0]["loss"] == pytest.approx(loss_of(source, first_forward), rel=1e-6)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["pretrained"]["format"] == "mae" and summary["pretrained"]["sha256_of"] == "mae_pretrain.pth"


@pytest.mark.slow
def test_resdecay_run_is_continued_as_a_fresh_run(capsys, tmp_path, sources, first_forward):
    """A decayed U-Net MAE's run folder: every weight (skip fusions, decoder) comes back, the step and the optimizer
    start again, the source is recorded; --resume continues the run's own checkpoints, not the source."""
    source_ckpt = newest(sources / "unet")
    out = continued(capsys, tmp_path / "run", UNET, sources / "unet")
    assert f"resdecay checkpoint, step {torch.load(source_ckpt, weights_only=True)['train_state']['step']}" in out
    rows = log_rows(tmp_path / "run")
    assert rows[0]["step"] == 1
    assert rows[0]["loss"] == pytest.approx(loss_of(load_model(source_ckpt)[0], first_forward), rel=1e-6)
    state = torch.load(newest(tmp_path / "run"), weights_only=True)
    steps = state["train_state"]["step"]
    assert steps == rows[-1]["step"] and all(s["step"] == steps for s in state["optimizer"]["state"].values())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["resumed_from"] is None and summary["steps"] == steps
    assert summary["pretrained"]["path"] == str(source_ckpt) and summary["pretrained"]["step"] > 0
    # --from with --resume auto: the run's own checkpoint is continued; the record stays
    code, stdout, err = run(capsys, "pretrain", "--preset", UNET, "--no-progress", "--out", tmp_path / "run", "--from",
                            sources / "unet", "--resume", "auto", *RUN, "train.epochs=2")
    assert code == 0, err
    assert "was not loaded: the run resumed from its own checkpoint" in stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2 * steps and summary["pretrained"]["path"] == str(source_ckpt)
    # started over without --from: no record of the earlier source
    code, _, err = run(capsys, "pretrain", "--preset", UNET, "--no-progress", "--out", tmp_path / "run", "--overwrite", *RUN)
    assert code == 0, err
    assert "pretrained" not in json.loads((tmp_path / "run" / "summary.json").read_text())
    assert not (tmp_path / "run" / "pretrained.json").exists()


@pytest.mark.slow
def test_sources_that_do_not_fit_are_refused_in_one_line(capsys, tmp_path, sources):
    """Checked before anything is written: no decoder, other shapes, another family, import flags without --from."""
    def refused(preset, source, *extra, size=RUN):
        code, _, err = run(capsys, "pretrain", "--preset", preset, "--out", tmp_path / "run", "--from", source, *size, *extra)
        assert not (tmp_path / "run").exists()
        return code, err

    assert_one_line_error(*refused(PLAIN, sources / "plain", "model.decoder_embed_dim=64", "model.decoder_num_heads=4"),
                          "do not fit preset mae-tiny-digits-plain", "model.decoder_embed_dim=32",
                          "model.decoder_num_heads=2", "(the source's)")
    assert_one_line_error(*refused(UNET, sources / "plain"), "model.skips=false", "model.encoder_norm=true")
    assert run(capsys, "export", newest(sources / "plain"), "--to", "timm", "--out", tmp_path / "vit.safetensors")[0] == 0
    assert_one_line_error(*refused(PLAIN, tmp_path / "vit.safetensors"), "has no MAE decoder", "timm ViT",
                          "resdecay finetune --from")
    torch.save(tiny_timm().state_dict(), tmp_path / "vit_classifier.pth")  # a timm ViT with its head
    assert_one_line_error(*refused(PLAIN, tmp_path / "vit_classifier.pth", "--alpha-min", "1",
                                  "--import-override", "model.num_heads=3", size=[]),
                          "holds a 'classifier' model, not an MAE with its decoder")
    assert_one_line_error(*refused("sit-tiny-fmnist", sources / "plain", size=[]), "continues an MAE's pretraining")
    code, _, err = run(capsys, "pretrain", "--preset", PLAIN, "--import-preset", PLAIN, *RUN)
    assert_one_line_error(code, err, "give --from SOURCE")


@pytest.mark.slow
def test_settings_that_keep_the_weights_are_named_in_a_note(capsys, sources):
    """Decaying a plain source while continuing it is allowed (the weights fit), and said; --print-config checks
    the source without training."""
    code, out, err = run(capsys, "pretrain", "--preset", PLAIN, "--from", sources / "plain", *RUN, "alpha_min=0.8",
                         "model.mask_ratio=0.5", "--print-config")
    assert code == 0, err
    (note,) = [line for line in out.splitlines() if line.startswith("note:")]
    assert "was trained with model.alpha_min=1.0 model.mask_ratio=0.75" in note
    assert "this run uses model.alpha_min=0.8 model.mask_ratio=0.5" in note
