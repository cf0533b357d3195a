"""Issue 31, item 5: decayed (and skipped) models train in the libraries' own loops. The two examples of
docs/plug-and-play.md's "Training in the library's own loop", run at CI size on scikit-learn's digits:
(a) docs/examples/hf_trainer_vitmae.py: an HF ViTMAEForPreTraining + ``unet_skips`` trained by transformers'
``Trainer``, saved with ``save_model``, reloaded by transformers' ``from_pretrained`` + ``restore``;
(b) docs/examples/diffusers_dit.py: a decayified diffusers DiT trained with ``DDPMScheduler`` (epsilon MSE)
and sampled with the scheduler's ``step`` loop into a PNG grid."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("diffusers")
pytest.importorskip("accelerate")  # transformers' Trainer needs it (the `test` extra)

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "docs" / "examples"
GUIDE = ROOT / "docs" / "plug-and-play.md"


def example(name: str) -> dict:
    """The example's module globals (its ``main(argv)`` returns what the test checks)."""
    return runpy.run_path(str(EXAMPLES / name), run_name="example_" + name.removesuffix(".py"))


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def test_vitmae_trains_in_the_hf_trainer_and_reloads_through_from_pretrained_and_restore(tmp_path, capsys):
    from transformers import ViTMAEForPreTraining

    import resdecay
    from resdecay.interop.hf_unet import restore

    run = example("hf_trainer_vitmae.py")["main"](["--steps", "30", "--out", str(tmp_path / "run"), "--seed", "0"])
    out = capsys.readouterr().out
    steps, losses = zip(*run["losses"], strict=True)
    assert list(steps) == list(range(1, 31))  # the Trainer logged every step
    assert mean(losses[-5:]) < 0.7 * mean(losses[:5]), losses
    assert " step  loss" in out and "    1  " in out and "   30  " in out
    assert "outputs for the same noise identical, alphas identical, skip weights identical" in out
    assert run["same_outputs"] and run["same_alphas"]

    folder = run["folder"]
    spec = json.loads((folder / "config.json").read_text())["resdecay"]
    steps = {s["op"]: s for s in spec["steps"]}  # resdecay.nn.config_record's schema
    assert spec["version"] == 1 and steps["decayify"] == {"op": "decayify", "on": "ViTMAEModel", "alpha_min": 0.6,
                                                          "schedule": "linear", "branches": "both"}
    assert steps["unet_skips"]["decoder_start"] == "content_free"
    assert (folder / "model.safetensors").is_file()

    # the test's own reload, as a user does it: transformers' from_pretrained, then one resdecay call
    trained = run["model"].eval()
    reloaded = restore(ViTMAEForPreTraining.from_pretrained(folder), folder).eval()
    x = run["images"][100:116]
    noise = torch.rand(len(x), 16, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want, got = trained(pixel_values=x, noise=noise), reloaded(pixel_values=x, noise=noise)
        assert torch.equal(got.logits, want.logits) and torch.equal(got.loss, want.loss)
        assert resdecay.alphas_of(reloaded) == resdecay.alphas_of(trained)
        enc = [a for _, pair in resdecay.alphas_of(reloaded.vit) for a in pair]
        assert enc[0] == 1.0 and enc[-1] == pytest.approx(0.6)  # the decay is really on
        # without restore the saved weights alone are another model (no decay, no skips)
        plain = ViTMAEForPreTraining.from_pretrained(folder).eval()
        assert not hasattr(plain, "resdecay_unet")
        assert not torch.allclose(plain(pixel_values=x, noise=noise).logits, want.logits, atol=1e-3)


def test_vitmae_positions_are_transformers_own_sincos():
    """transformers 5.x leaves a config-built ViTMAE's frozen positions at zero; the example fills them with
    the layout transformers' own ViTMAEDecoder.initialize_weights writes (and leaves weights alone)."""
    ex = example("hf_trainer_vitmae.py")
    model = ex["build_model"](0)
    enc, dec = model.vit.embeddings.position_embeddings, model.decoder.decoder_pos_embed
    assert bool(enc.any()) and bool(dec.any()) and not enc.requires_grad and not dec.requires_grad
    mine = dec.detach().clone()
    model.decoder.initialize_weights(model.vit.embeddings.patch_embeddings.num_patches)
    assert torch.equal(model.decoder.decoder_pos_embed, mine)
    assert torch.equal(enc[..., :dec.shape[-1]], mine)  # same widths here: the same table


def test_dit_trains_with_ddpm_and_samples_with_the_scheduler_loop(tmp_path, capsys):
    ex = example("diffusers_dit.py")
    run = ex["main"](["--steps", "60", "--batch-size", "32", "--sample-steps", "10", "--rows", "1",
                      "--out", str(tmp_path / "run"), "--seed", "0"])
    out = capsys.readouterr().out
    steps, losses = zip(*run["losses"], strict=True)
    assert list(steps) == list(range(1, 61))
    assert mean(losses[-10:]) < 0.5 * mean(losses[:10]), losses
    assert " step  loss" in out and "    1  " in out and "   60  " in out and "all finite" in out

    samples = run["samples"]
    assert samples.shape == (10, 4, 8, 8) and bool(torch.isfinite(samples).all())
    assert samples.std() > 0.05  # not collapsed to a constant
    assert run["classes"].tolist() == list(range(10))
    png = run["png"]
    assert png == tmp_path / "run" / "samples.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    assert matplotlib.image.imread(png).ndim == 3

    # the data: every digit as a (4, 8, 8) stack in [-1, 1]; the grid's pictures are 16x16
    latents, labels = ex["digit_latents"]()
    assert latents.shape == (1797, 4, 8, 8) and sorted(set(labels.tolist())) == list(range(10))
    assert latents.min() >= -1 and latents.max() <= 1
    assert ex["to_images"](latents[:3]).shape == (3, 16, 16)
    # the model is the decayified DiT, saved in diffusers' own format with its decay beside it: diffusers'
    # from_pretrained + decayify(**resdecay.json) gives the trained model's epsilon
    import resdecay
    model = run["model"].eval()
    alphas = [a for _, pair in resdecay.alphas_of(model) for a in pair]
    assert alphas[0] == 1.0 and alphas[-1] == pytest.approx(0.6)
    reloaded = ex["reload"](tmp_path / "run" / "model")
    assert resdecay.alphas_of(reloaded) == resdecay.alphas_of(model)
    x, t, y = latents[:8], torch.arange(8) * 120, labels[:8]
    with torch.no_grad():
        assert torch.equal(reloaded(x, timestep=t, class_labels=y).sample, model(x, timestep=t, class_labels=y).sample)


@pytest.mark.parametrize("script", ["hf_trainer_vitmae.py", "diffusers_dit.py", "hf_trainer_clip.py"])
@pytest.mark.parametrize("args, says", [
    (["--steps", "3"], "--steps must be at least"),
    (["--steps", "x"], "invalid int value"),
    (["--seed", "-1"], "--seed must lie in [0, 2**32)"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--out", "FILE"], "is a file; give a folder"),
])
def test_bad_arguments_are_one_line_and_exit_2(script, args, says, tmp_path):
    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / "FILE") if a == "FILE" else a for a in args]
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1 and says in proc.stderr, proc.stderr


def test_the_guide_shows_both_commands():
    text = GUIDE.read_text()
    section = text[text.index("## Training in the library's own loop"):]
    for script in ("hf_trainer_vitmae.py", "diffusers_dit.py"):
        assert f"python docs/examples/{script} --steps" in section
        assert (EXAMPLES / script).is_file()


def test_clip_vision_tower_trains_in_the_hf_trainer_and_reloads_through_from_pretrained_and_restore(tmp_path, capsys):
    """docs/examples/hf_trainer_clip.py: a decayified CLIPForImageClassification (its CLIPEncoderLayers hooked, branches
    zero-initialised) trained by transformers' Trainer; transformers' from_pretrained + restore give back its logits
    and alphas; config.json records the decay in resdecay's schema."""
    run = example("hf_trainer_clip.py")["main"](["--steps", "30", "--out", str(tmp_path / "run"), "--seed", "0"])
    out = capsys.readouterr().out
    steps, losses = zip(*run["losses"], strict=True)
    assert list(steps) == list(range(1, 31))
    assert mean(losses[-5:]) < mean(losses[:5]), losses
    assert "4 CLIPEncoderLayers, alphas 1.00 0.94" in out and "logits identical, alphas identical" in out
    assert run["same_outputs"] and run["same_alphas"]
    spec = json.loads((run["folder"] / "config.json").read_text())["resdecay"]
    assert spec["steps"] == [{"op": "decayify", "on": "CLIPForImageClassification", "alpha_min": 0.6,
                              "schedule": "linear", "branches": "both"}]
