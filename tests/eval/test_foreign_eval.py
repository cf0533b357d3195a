"""``resdecay eval`` on models trained elsewhere: a timm ViT with a weights file (plain and
``save_decayified``), a transformers ViTMAE folder and a diffusers DiT folder are measured by the same suite as
a resdecay checkpoint, behind ``stream.foreign.ForeignEncoder``; ``--evals diagnostics`` prints the per-block table and
writes its PNG; a model no adapter reaches, a missing ``--data`` and other bad input are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

import resdecay
from helpers import ROOT, assert_one_line_error, run
from resdecay.interop.foreign_model import load_foreign
from resdecay.stream.foreign import ForeignEncoder

DIGITS_VIT = dict(img_size=8, patch_size=2, in_chans=1, depth=3, embed_dim=32, num_heads=2, num_classes=10)
VIT_ARGS = [a for k, v in DIGITS_VIT.items() if k != "num_classes" for a in ("--model-arg", f"{k}={v}")]
SMALL = ["--max-train", "300", "--max-test", "100", "--no-progress", "--diag-images", "60", "--diag-train-images", "120",
         "--knockout-images", "16"]


def _timm_vit(seed=0):
    import timm
    torch.manual_seed(seed)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, **DIGITS_VIT)


@pytest.fixture(scope="module")
def foreign_files(tmp_path_factory):
    """A timm ViT's state_dict, the same ViT decayified (save_decayified), an HF ViTMAE folder and a DiT folder."""
    import diffusers
    import transformers

    root = tmp_path_factory.mktemp("foreign")
    torch.save(_timm_vit(1).state_dict(), root / "vit.pth")
    decayed = resdecay.decayify(_timm_vit(1), alpha_min=0.6)
    resdecay.save_decayified(decayed, root / "vit_decayed.pt")
    torch.manual_seed(0)
    cfg = transformers.ViTMAEConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=64, decoder_hidden_size=16,
                                    decoder_num_hidden_layers=1, decoder_num_attention_heads=2, decoder_intermediate_size=32)
    transformers.ViTMAEForPreTraining(cfg).save_pretrained(root / "hf-vitmae")
    diffusers.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=1, out_channels=1,
                                    num_layers=2, sample_size=8, patch_size=2,
                                    num_embeds_ada_norm=10).save_pretrained(root / "dit")
    return root


def test_foreign_encoder_reads_the_blocks_outputs_timm_computes():
    vit = _timm_vit().eval()
    enc = ForeignEncoder(vit, "timm:vit_tiny_patch16_224")
    x = torch.randn(3, 1, 8, 8)
    ours = enc.forward_intermediates(x, [0, -1])
    with torch.no_grad():
        h = vit.pos_drop(vit._pos_embed(vit.patch_embed(x)))
        expected = []
        for blk in vit.blocks:
            h = blk(h)
            expected.append(h)
    torch.testing.assert_close(ours[0], expected[0], rtol=0, atol=0)
    torch.testing.assert_close(ours[1], expected[-1], rtol=0, atol=0)
    assert enc.cfg.prefix_tokens == 1 and enc.cfg.token_grid == (4, 4) and len(enc.blocks) == 3
    # the blocks are the model's own, registered once (the state_dict is the model's under "model.")
    assert set(enc.state_dict()) == {f"model.{k}" for k in vit.state_dict()}


def test_a_save_decayified_file_is_measured_with_its_decay(foreign_files):
    plain = load_foreign("timm:vit_tiny_patch16_224", str(foreign_files / "vit.pth"), dict(DIGITS_VIT))
    decayed = load_foreign("timm:vit_tiny_patch16_224", str(foreign_files / "vit_decayed.pt"), dict(DIGITS_VIT))
    x = torch.randn(2, 1, 8, 8)
    a = ForeignEncoder(plain.model, "p").forward_features(x)
    b = ForeignEncoder(decayed.model, "d").forward_features(x)
    assert not torch.allclose(a, b)  # same weights, but the decay is back on
    assert ForeignEncoder(decayed.model, "d").cfg.alpha_min == pytest.approx(0.6)
    # the random-init baseline is the same architecture with the same decay, freshly drawn
    assert getattr(decayed.fresh(), "resdecay_spec", None) == decayed.model.resdecay_spec


def test_run_eval_takes_paths_built_models_and_targets(foreign_files, tmp_path):
    from resdecay.eval.targets import CheckpointTarget, ForeignTarget, as_target

    built = load_foreign("timm:vit_tiny_patch16_224", str(foreign_files / "vit.pth"), dict(DIGITS_VIT))
    target = as_target(built)
    assert isinstance(target, ForeignTarget) and target.built is built and as_target(target) is target
    assert target.name == "timm:vit_tiny_patch16_224"
    assert target.report_dir(str(tmp_path)) == tmp_path / "timm-vit_tiny_patch16_224"
    assert target.cache_dir(tmp_path / "r") == tmp_path / "r" / "cache"
    ckpt = as_target(str(tmp_path / "run" / "checkpoints" / "step_00000010.pt"))
    assert isinstance(ckpt, CheckpointTarget) and ckpt.report_dir(None) == tmp_path / "run" / "eval"
    with pytest.raises(TypeError, match="not int"):
        as_target(3)


def test_eval_of_a_timm_vit_runs_the_suite_and_the_diagnostics(foreign_files, tmp_path, capsys):
    code, out, err = run(capsys, "eval", "--model", "timm:vit_tiny_patch16_224", "--weights", foreign_files / "vit.pth",
                         *VIT_ARGS, "--data", "digits", "--evals", "knn,rank,diagnostics", *SMALL, "--out", tmp_path)
    assert code == 0, err
    folder = tmp_path / "timm-vit_tiny_patch16_224"
    report = json.loads((folder / "eval.json").read_text())
    metrics = {(r["metric"], r["feature"]) for r in report["results"]}
    assert {("knn", "mean"), ("rank", "cls"), ("diagnostics", "direct_share"), ("diagnostics", "pixel_r2")} <= metrics
    assert report["step"] is None and report["label"] == "timm:vit_tiny_patch16_224 (plain)"
    assert {b["source"] for b in report["baselines"]} == {"pixels", "random-init"}
    diag = [r for r in report["results"] if r["metric"] == "diagnostics"]
    assert sorted({r["layer"] for r in diag}) == [0, 1, 2]
    share = {r["layer"]: r["values"]["value"] for r in diag if r["feature"] == "direct_share"}
    assert [share[i] for i in range(3)] == pytest.approx(report["diagnostics"]["paths"]["direct_projection"])
    assert (folder / "diagnostics.png").stat().st_size > 10_000
    assert "direct_share" in out and "pixel_r2" in out and "diagnostics.png" in out


@pytest.mark.parametrize("folder", ["hf-vitmae", "dit"])
def test_eval_of_library_folders(foreign_files, folder, tmp_path, capsys):
    """An HF ViTMAE folder (unmasked, patch order kept) and a diffusers DiT (fixed timestep and class)."""
    code, out, err = run(capsys, "eval", "--model", foreign_files / folder, "--data", "digits", "--evals",
                         "knn,diagnostics", *SMALL, "--no-baselines", "--out", tmp_path)
    assert code == 0, err
    (report_file,) = tmp_path.glob("*/eval.json")
    report = json.loads(report_file.read_text())
    paths = report["diagnostics"]["paths"]
    assert max(paths["reconstruction_error"]) < 1e-4  # the parts sum to the stream
    assert (report_file.parent / "diagnostics.png").is_file()


def test_profile_of_a_foreign_model_has_the_shortcut_columns(foreign_files, tmp_path, capsys):
    code, out, err = run(capsys, "eval", "--model", "timm:vit_tiny_patch16_224", "--weights",
                         foreign_files / "vit_decayed.pt", *VIT_ARGS, "--data", "digits", "--layer", "all",
                         "--evals", "knn", "--no-baselines", *SMALL, "--out", tmp_path)
    assert code == 0, err
    profile = json.loads(next(tmp_path.glob("*/profile.json")).read_text())["profile"]
    assert len(profile) == 3 and all("knn_top1" in row and "shortcut_ratio_attn" in row and "shortcut_ratio_mlp" in row for row in profile)


@pytest.mark.parametrize("argv, fragments", [
    (["--model", "timm:vit_tiny_patch16_224"], ["--data NAME"]),
    (["--model", "timm:no_such_model", "--data", "digits"], ["timm:no_such_model"]),
    (["--model", "timm:vit_tiny_patch16_224", "--weights", "/nonexistent.pth", "--data", "digits"], ["does not exist"]),
    (["--weights", "w.pth", "--data", "digits"], ["--model SPEC"]),
    (["--model", "nothing-here", "--data", "digits"], ["neither timm:NAME", "torchvision:NAME nor a save_pretrained folder"]),
    (["--model", ".", "--weights", "w.pth", "--data", "digits"], ["holds its own weights", "drop --weights"]),
    (["--model", "timm:vit_tiny_patch16_224", "--model-arg", "img_size", "--data", "digits"], ["KEY=VALUE"]),
    *[(["--model", "timm:vit_tiny_patch16_224", *VIT_ARGS, "--data", "digits", "--evals", "diagnostics", *bad], [says])
      for bad, says in ((["--diag-images", "0"], "--diag-images (diagnostics.images) must be at least 2"),
                        (["--knockout-images", "0"], "--knockout-images (diagnostics.knockout_images) must be at least 1"),
                        (["--metric-option", "diagnostics.ridge=-1"], "diagnostics.ridge must be a positive"),
                        (["--metric-option", "diagnostics.pixel_patches=-3"], "diagnostics.pixel_patches must be"))],
    (["--model", "torchvision:resnet18", "--model-arg", "img_size=8", "--data", "digits", "--evals", "diagnostics"],
     ["digits images have 1 channel(s)", "takes 3"]),
])
def test_bad_foreign_input_is_one_line(argv, fragments, tmp_path, capsys):
    code, _, err = run(capsys, "eval", *argv, "--out", tmp_path / "out", "--no-progress")
    assert_one_line_error(code, err, *fragments)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_foreign_model_after_a_checkpoint_is_checked_before_the_checkpoint_is_measured(tiny_checkpoints, tmp_path,
                                                                                           capsys):
    """Every target is checked before the first feature is extracted: a --model with no --data (its data set cannot
    be the checkpoint's) costs a second, not the checkpoint's evaluation."""
    code, _, err = run(capsys, "eval", tiny_checkpoints["plain"], "--model", "timm:vit_tiny_patch16_224", *VIT_ARGS,
                       "--evals", "knn", "--no-progress", "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")
    assert_one_line_error(code, err, "--model timm:vit_tiny_patch16_224", "--data NAME")
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_segmentation_of_a_timm_vit_reads_its_patch_tokens(fake_fmnist, tmp_path, capsys):
    """Unsupervised segmentation on Fashion-MNIST-M's label maps, through the foreign encoder's token grid; without
    --weights the weights are drawn with seed 0, so the model and its random-init baseline are the same network."""
    code, out, err = run(capsys, "eval", "--model", "timm:vit_tiny_patch16_224", "--model-arg", "img_size=32",
                         "--model-arg", "patch_size=8", "--model-arg", "depth=2", "--data", "fashion-mnist-m", "--data-path",
                         fake_fmnist, "--evals", "segmentation", "--seg-images", "12", "--seg-solver", "kmeans",
                         "--no-progress", "--out", tmp_path)
    assert code == 0, err
    report = json.loads(next(tmp_path.glob("*/eval.json")).read_text())
    (row,) = [r for r in report["results"] if r["metric"] == "segmentation"]
    assert row["protocol"]["token_grid"] == [4, 4] and 0 <= row["values"]["miou"] <= 1
    assert {b["source"] for b in report["baselines"]} == {"pixels", "random-init"}
    random_init = next(b for b in report["baselines"] if b["source"] == "random-init")
    assert random_init["values"]["miou"] == row["values"]["miou"]
    # no downloads: a timm name alone is never timm's pretrained model, and the report's label says what it is
    assert report["label"] == "timm:vit_tiny_patch16_224 (plain), random weights (seed 0: no --weights)"
    assert report["label"] in out


def test_load_foreign_hands_the_spec_to_the_first_registered_format_that_takes_it(tmp_path):
    """A format may take specs by its own rule (``matches``); the conditioning and input sizes are split off the
    model arguments before its ``load`` sees them; ``--weights`` is checked against the format."""
    from resdecay.interop.foreign_model import ModelFormat, register_model_format, unregister_model_format

    seen = {}

    class Conditioned(torch.nn.Module):  # a backbone whose forward takes (x, t): a timestep is its to take
        def forward(self, x, t):
            return x

    def load(spec, weights, args):
        seen.update(spec=spec, weights=weights, args=args)
        return Conditioned(), Conditioned

    register_model_format(ModelFormat("dotmine", load, "FILE.mine", takes_weights=True,
                                      matches=lambda spec: spec.endswith(".mine")))
    try:
        weights = tmp_path / "w.pth"
        weights.write_bytes(b"")
        built = load_foreign("lab/vit.mine", str(weights), {"img_size": 8, "timestep": 3})
        assert seen == {"spec": "lab/vit.mine", "weights": str(weights), "args": {"img_size": 8}}
        assert built.source == "lab/vit.mine" and built.inputs == {"img_size": 8} and built.conditioning == (3,)
        with pytest.raises(resdecay.errors.UserError, match="--weights .*missing.pth does not exist"):
            load_foreign("lab/vit.mine", str(tmp_path / "missing.pth"))
        assert load_foreign("timm:vit_tiny_patch16_224", None, dict(DIGITS_VIT)).source.startswith("timm:")
    finally:
        unregister_model_format("dotmine")


@pytest.mark.parametrize("make, says", [
    (lambda F: F("my:zoo", _timm_vit, "my:zoo:NAME"), "must be a word without ':'"),
    (lambda F: F("", _timm_vit, "NAME"), "must be a word"),
    (lambda F: F("zoo2", "not a function", "zoo2:NAME"), "load must be a function"),
    (lambda F: F("zoo2", _timm_vit, ""), "written must be a non-empty string"),
    (lambda F: F("zoo2", _timm_vit, "zoo2:NAME", matches="zoo2"), "matches must be a function"),
    (lambda F: {"name": "zoo2"}, "takes a ModelFormat"),
])
def test_a_model_format_that_cannot_work_is_refused_when_registered(make, says):
    from resdecay.errors import RegistryError
    from resdecay.interop.foreign_model import MODEL_FORMATS, ModelFormat, register_model_format

    before = dict(MODEL_FORMATS)
    with pytest.raises(RegistryError, match=says) as e:
        register_model_format(make(ModelFormat))
    assert "\n" not in str(e.value) and MODEL_FORMATS == before


@pytest.mark.parametrize("load, says", [
    (lambda spec, weights, args: _timm_vit(), "returned VisionTransformer, not (model, fresh)"),
    (lambda spec, weights, args: (None, _timm_vit), "returned tuple, not (model, fresh)"),
    (lambda spec, weights, args: _timm_vit(depth="three"), "--model broken:x: "),
])
def test_a_format_whose_load_fails_is_one_line_naming_the_format(load, says, capsys, tmp_path):
    """A plugin format's load that returns the wrong thing, or a constructor that refuses a --model-arg deep inside
    its library: one line naming the spec and the format, exit 2, nothing written."""
    from resdecay.interop.foreign_model import ModelFormat, register_model_format, unregister_model_format

    register_model_format(ModelFormat("broken", load, "broken:NAME"))
    try:
        code, _, err = run(capsys, "eval", "--model", "broken:x", "--data", "digits", "--out", tmp_path / "out")
    finally:
        unregister_model_format("broken")
    assert_one_line_error(code, err, says, "broken format")
    assert not (tmp_path / "out").exists()


def test_a_model_arg_the_plugin_constructor_refuses_is_one_line(capsys, tmp_path):
    """docs/examples/extending/model_format.py with a --model-arg timm cannot take: one line, not timm's traceback."""
    import sys
    modules = set(sys.modules)
    try:
        code, _, err = run(capsys, "--plugin", ROOT / "docs" / "examples" / "extending" / "model_format.py", "eval",
                           "--model", "zoo:digits-vit", "--model-arg", "embed_dim=abc", "--data", "digits",
                           "--out", tmp_path / "out")
    finally:
        from resdecay.interop.foreign_model import MODEL_FORMATS, unregister_model_format
        if "zoo" in MODEL_FORMATS:
            unregister_model_format("zoo")
        for name in set(sys.modules) - modules:
            if name.startswith("resdecay_plugin_"):
                del sys.modules[name]
    assert_one_line_error(code, err, "--model zoo:digits-vit", "the zoo format", "--model-arg")
    assert not (tmp_path / "out").exists()
