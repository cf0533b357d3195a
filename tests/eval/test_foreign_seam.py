"""Issue 49: where a model trained elsewhere enters ``resdecay eval``, no wrong number and no traceback.

The silent ones first, through the command line where they were found: a decay installed on a part of the model
(``decayify(mae.vit)``, a restored ``unet_skips`` folder) labelled "plain"; one transformers config object shared by
two models carrying one model's decay into the other; a folder saved again measured from the stale feature cache.
Then the bad-input sweep: every case is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

import resdecay
from helpers import assert_one_line_error, run

SMALL = ["--data", "digits", "--max-train", "120", "--max-test", "60", "--no-progress"]
VIT = dict(image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
           intermediate_size=64)
MAE = dict(VIT, decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
           decoder_intermediate_size=32)


def _mae(config=None, seed=0):
    import transformers

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.ViTMAEForPreTraining(config or transformers.ViTMAEConfig(**MAE))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """save_pretrained folders: a ViTMAE plain, with its encoder decayified, with U-Net skips; a ViT; a DiT."""
    import diffusers
    import transformers

    from resdecay.interop.hf_unet import unet_skips

    root = tmp_path_factory.mktemp("seam")
    _mae().save_pretrained(root / "mae-plain")
    decayed = _mae()
    resdecay.decayify(decayed.vit, alpha_min=0.6)  # as docs/plug-and-play.md advises: the encoder only
    decayed.save_pretrained(root / "mae-encoder-decayed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unet_skips(skips := _mae(), alpha_min=0.6)
    skips.save_pretrained(root / "mae-unet")
    torch.manual_seed(0)
    transformers.ViTModel(transformers.ViTConfig(**VIT)).save_pretrained(root / "vit")
    diffusers.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=16, in_channels=1, out_channels=1,
                                    num_layers=2, sample_size=8, patch_size=2,
                                    num_embeds_ada_norm=10).save_pretrained(root / "dit")
    return root


def _report(out):
    (file,) = out.glob("*/eval.json")
    return json.loads(file.read_text())


# ----------------------------------------------------------------------------- silent wrong results
def test_a_decayed_encoder_is_labelled_with_its_decay_not_plain(folders, tmp_path, capsys):
    """Item 1: decayify(mae.vit) + save_pretrained, then eval --model FOLDER: the label, the model card and compare
    say the decay measured (alpha 1 ... 0.6 on vit), not 'plain'."""
    reports = {}
    for name in ("mae-plain", "mae-encoder-decayed"):
        code, out, err = run(capsys, "eval", "--model", folders / name, *SMALL, "--evals", "knn,rank",
                             "--out", tmp_path / name)
        assert code == 0, err
        reports[name] = _report(tmp_path / name)
    decayed = reports["mae-encoder-decayed"]
    assert decayed["model"]["alpha_min"] == pytest.approx(0.6) and decayed["model"]["schedule"] == "linear on vit"
    assert decayed["label"].endswith("(alpha_min 0.6, linear on vit)")
    assert decayed["alphas"]["model.vit.layers.1"] == [pytest.approx(0.7333, abs=1e-4), pytest.approx(0.6)]
    assert reports["mae-plain"]["label"].endswith("(plain)") and reports["mae-plain"]["model"]["alpha_min"] == 1.0
    code, out, err = run(capsys, "compare", *[next((tmp_path / n).glob("*/eval.json")) for n in reports],
                         "--out", tmp_path / "compare")
    assert code == 0, err
    assert out.count("(plain)") == 1 and "alpha_min 0.6, linear on vit" in out


def test_a_unet_skips_folder_is_labelled_decayed_and_gets_its_random_init_baseline(folders, tmp_path, capsys):
    """Items 1 and 10: the U-Net ViTMAE folder (what docs/examples/hf_trainer_vitmae.py saves) is restored by the
    command, labelled with its encoder's decay, and its random-init baseline (fresh skips, nothing trained) is
    measured instead of failing after the extraction with advice for Python callers."""
    code, out, err = run(capsys, "eval", "--model", folders / "mae-unet", *SMALL, "--evals", "knn", "--out", tmp_path)
    assert code == 0, err
    report = _report(tmp_path)
    assert report["model"]["alpha_min"] == pytest.approx(0.6) and "(plain)" not in report["label"]
    assert {b["source"] for b in report["baselines"]} == {"pixels", "random-init"}


def test_one_config_object_two_models_keeps_the_decay_on_the_model_decayified(tmp_path):
    """Item 4: ``a, b`` built from one config object, ``decayify(a)``: b's config stays without a record, so b saved
    and restored comes back plain; a keeps its record, shared by its own parts."""
    import transformers

    from resdecay.interop import restore

    config = transformers.ViTMAEConfig(**MAE)
    a, b = _mae(config), _mae(config, seed=1)
    assert a.config is b.config  # transformers keeps the object it is given
    resdecay.decayify(a.vit, alpha_min=0.6)
    assert getattr(b.config, "resdecay", None) is None and getattr(config, "resdecay", None) is None
    assert a.config.resdecay["steps"][0]["alpha_min"] == 0.6 and a.vit.config is a.config
    b.save_pretrained(tmp_path / "b")
    a.save_pretrained(tmp_path / "a")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b_back = transformers.ViTMAEForPreTraining.from_pretrained(tmp_path / "b")
        a_back = restore(transformers.ViTMAEForPreTraining.from_pretrained(tmp_path / "a"))
    with pytest.raises(resdecay.errors.UserError, match="nothing to restore"):
        restore(b_back)
    assert all(a == 1.0 for _, alphas in resdecay.alphas_of(b_back) for a in alphas)
    assert resdecay.alphas_of(a_back)[1][1] == (pytest.approx(0.7333, abs=1e-4), pytest.approx(0.6))


def test_a_folder_saved_again_is_measured_again(folders, tmp_path, capsys):
    """Found beside the issue: a folder's feature-cache key was its path and config, so new weights saved into the
    same folder were measured from the old model's cached features. The folder's files key the cache now."""
    import transformers

    folder = tmp_path / "vit"
    shutil.copytree(folders / "vit", folder)
    argv = ["eval", "--model", folder, *SMALL, "--evals", "knn", "--no-baselines", "--out", tmp_path / "out"]
    assert run(capsys, *argv)[0] == 0
    first = _report(tmp_path / "out")
    model = transformers.ViTModel.from_pretrained(folder)
    torch.manual_seed(3)
    for p in model.parameters():
        p.data.normal_()
    model.save_pretrained(folder)
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert "train new, test new" in out
    assert _report(tmp_path / "out")["checkpoint_sha256"] != first["checkpoint_sha256"]


# ----------------------------------------------------------------------------- folders that load
def test_a_folder_without_architectures_is_measured_with_its_baselines(folders, tmp_path, capsys):
    """Item 5: config.json without ``architectures`` (transformers' AutoModel loads it): its random-init baseline is
    the class AutoModel gave, built afresh, where ``AutoModel(config)`` raised after the extraction."""
    folder = tmp_path / "noarch"
    shutil.copytree(folders / "vit", folder)
    config = json.loads((folder / "config.json").read_text())
    del config["architectures"]
    (folder / "config.json").write_text(json.dumps(config))
    code, out, err = run(capsys, "eval", "--model", folder, *SMALL, "--evals", "knn", "--out", tmp_path / "out")
    assert code == 0, err
    assert {b["source"] for b in _report(tmp_path / "out")["baselines"]} == {"pixels", "random-init"}


def test_the_size_hint_leads_to_a_run_that_works(tmp_path, capsys):
    """Item 11: the refusal names eval's own options; --resize (new) and --model-arg img_size both then work."""
    vit = ["--model", "timm:vit_tiny_patch16_224", "--model-arg", "depth=1", "--model-arg", "in_chans=1"]
    code, _, err = run(capsys, "eval", *vit, *SMALL, "--evals", "knn", "--out", tmp_path / "a")
    assert_one_line_error(code, err, "--resize", "--model-arg img_size=8")
    assert "model.img_size=" not in err and "data.resize" not in err
    for extra in (["--model-arg", "img_size=32", "--model-arg", "patch_size=8", "--resize"],
                  ["--model-arg", "img_size=8", "--model-arg", "patch_size=2"]):
        code, _, err = run(capsys, "eval", *vit, *extra, *SMALL, "--evals", "knn", "--no-baselines", "--out",
                           tmp_path / "b")
        assert code == 0, err
    assert _report(tmp_path / "b")["model"]["img_size"] == 8


def test_a_checkpoints_size_fix_is_resize(tiny_checkpoints, fake_fmnist, tmp_path, capsys):
    """Item 11 for a checkpoint: its model is fixed, so the fix is --resize, which then runs."""
    argv = ["eval", tiny_checkpoints["plain"], "--data", "fashion-mnist", "--data-path", fake_fmnist, "--evals", "knn",
            "--no-baselines", "--no-progress", "--max-train", "60", "--max-test", "30", "--out", tmp_path]
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, "pass --resize", "28x28")
    code, _, err = run(capsys, *argv, "--resize")
    assert code == 0, err


def test_a_timm_cnn_takes_the_img_size_its_hint_asks_for(tmp_path, capsys):
    """Item 13: --model-arg img_size=N reaches the evaluators, not a ResNet constructor that takes none."""
    code, _, err = run(capsys, "eval", "--model", "timm:resnet18", *SMALL, "--evals", "knn", "--out", tmp_path)
    assert_one_line_error(code, err, "--model-arg img_size=N")
    code, _, err = run(capsys, "eval", "--model", "timm:resnet18", "--model-arg", "img_size=8", "--model-arg",
                       "in_chans=1", *SMALL, "--evals", "knn", "--no-baselines", "--out", tmp_path)
    assert code == 0, err


def _remote_code_folder(folders, root):
    """A transformers folder whose model class is its own Python file (config.json's auto_map)."""
    folder = root / "remote"
    shutil.copytree(folders / "vit", folder)
    (folder / "modeling_toyvit.py").write_text(
        "from transformers import ViTConfig, ViTModel\n\n\nclass ToyViTConfig(ViTConfig):\n    model_type = 'toyvit'\n\n\n"
        "class ToyViTModel(ViTModel):\n    config_class = ToyViTConfig\n")
    config = json.loads((folder / "config.json").read_text())
    config.update(model_type="toyvit", architectures=["ToyViTModel"],
                  auto_map={"AutoConfig": "modeling_toyvit.ToyViTConfig", "AutoModel": "modeling_toyvit.ToyViTModel"})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_remote_code_runs_only_with_the_flag_which_names_the_file(folders, tmp_path, capsys):
    """Item 9: a folder's own Python runs only with --trust-remote-code, which names the file first; through
    --model-arg it is refused."""
    folder = _remote_code_folder(folders, tmp_path)
    code, _, err = run(capsys, "eval", "--model", folder, *SMALL, "--out", tmp_path / "a")
    assert_one_line_error(code, err, "--trust-remote-code", "modeling_toyvit.py")
    code, _, err = run(capsys, "eval", "--model", folder, "--model-arg", "trust_remote_code=true", *SMALL,
                       "--out", tmp_path / "b")
    assert_one_line_error(code, err, "--model-arg trust_remote_code is refused", "--trust-remote-code")
    code, out, err = run(capsys, "eval", "--model", folder, "--trust-remote-code", *SMALL, "--evals", "knn",
                         "--no-baselines", "--out", tmp_path / "c")
    assert code == 0, err
    assert f"warning: --trust-remote-code: running {folder / 'modeling_toyvit.py'}" in out


# ----------------------------------------------------------------------------- the bad-input sweep
def _bad_folder(folders, root, name):
    """The folder variants of items 8: a pickle payload, a truncated safetensors file, a non-class architecture."""
    folder = root / name
    shutil.copytree(folders / "vit", folder)
    weights = folder / "model.safetensors"
    if name == "pickle":
        weights.unlink()

        class Payload:
            def __reduce__(self):
                return (shutil.copy, (str(folder / "config.json"), str(root / "PAYLOAD-RAN")))

        torch.save({"x": Payload()}, folder / "pytorch_model.bin")
    elif name == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        config = json.loads((folder / "config.json").read_text())
        config["architectures"] = ["logging"]
        (folder / "config.json").write_text(json.dumps(config))
    return folder


VIT_TIMM = ["--model", "timm:vit_tiny_patch16_224", "--model-arg", "img_size=8", "--model-arg", "patch_size=2",
            "--model-arg", "in_chans=1", "--model-arg", "depth=1"]
SWEEP = {  # item: (argv, what the line must say); FOLDER/x is folders / x, BAD/x a damaged copy
    "6 yaml list": (["--model", "timm:vit_tiny_patch16_224", "--model-arg", "depth=[4"], ["'[4' is not a YAML value"]),
    "6 yaml map": (["--model", "timm:vit_tiny_patch16_224", "--model-arg", "x={file:"], ["'{file:' is not a YAML value"]),
    "7 timestep text": (["--model", "FOLDER/dit", "--model-arg", "timestep=abc"], ["timestep='abc'", "a number >= 0"]),
    "7 class out of range": (["--model", "FOLDER/dit", "--model-arg", "class_label=999"],
                             ["a forward pass", "(500, 999)", "class_label"]),
    "7 timestep on a ViT": ([*VIT_TIMM, "--model-arg", "timestep=5"], ["diffusion backbone", "takes none"]),
    "8 pickle payload": (["--model", "BAD/pickle"], ["pytorch_model.bin", "refused for safety"]),
    "8 truncated safetensors": (["--model", "BAD/truncated"], ["model.safetensors is not a readable safetensors file"]),
    "8 architectures logging": (["--model", "BAD/logging"], ["'logging'", "not a model class"]),
    "9 remote code by model-arg": (["--model", "FOLDER/vit", "--model-arg", "trust_remote_code=true"],
                                   ["--trust-remote-code"]),
    "9 remote code flag on timm": ([*VIT_TIMM, "--trust-remote-code"], ["applies to a transformers save_pretrained"]),
    "11 channels": (["--model", "timm:vit_tiny_patch16_224", "--model-arg", "img_size=8", "--model-arg", "patch_size=2"],
                    ["--model-arg in_chans=1"]),
    "12 transformers folder as checkpoint": (["FOLDER/vit"], ["resdecay eval --model", "--data NAME"]),
    "12 diffusers folder as checkpoint": (["FOLDER/dit"], ["diffusers save_pretrained folder", "--model"]),
    "9 remote code flag without auto_map": (["--model", "FOLDER/vit", "--trust-remote-code"],
                                            ["names no transformers model code of its own", "drop the flag"]),
    "11 torchvision channels": (["--model", "torchvision:resnet18", "--model-arg", "img_size=8"],
                                ["takes 3", "measure it on images of 3 channel(s)"]),
    "14 weights folder": (["--model", "timm:vit_tiny_patch16_224", "--weights", "FOLDER"], ["is a folder"]),
    "14 weights save_pretrained folder": (["--model", "timm:vit_tiny_patch16_224", "--weights", "FOLDER/vit"],
                                          ["--model", "without --weights"]),
}


@pytest.mark.parametrize("case", list(SWEEP))
def test_the_bad_input_sweep_is_one_line_each(case, folders, tmp_path, capsys):
    argv, says = SWEEP[case]
    names = {"pickle", "truncated", "logging"}
    argv = [str(_bad_folder(folders, tmp_path, a[4:])) if a.startswith("BAD/") and a[4:] in names
            else str(folders / a[7:]) if a.startswith("FOLDER/") else str(folders) if a == "FOLDER" else a for a in argv]
    code, _, err = run(capsys, "eval", *argv, *SMALL, "--evals", "knn", "--out", tmp_path / "out")
    assert_one_line_error(code, err, *says)
    if case == "11 torchvision channels":  # its constructors take no in_chans: the fix does not offer one
        assert "in_chans" not in err
    assert not (tmp_path / "out").exists()  # refused before anything was written
    assert not (tmp_path / "PAYLOAD-RAN").exists()  # the pickle's payload never ran
