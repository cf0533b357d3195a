"""Sharing models (issue 22, item 3): save_pretrained -> from_pretrained for every family and for
decayified timm / torchvision models, the model card, ``export --to hf``, and the alpha travelling
with every format. Nothing here contacts a network: hub calls are replaced by fakes."""

import json
import re
import warnings
from pathlib import Path

import pytest
import torch

import resdecay
from helpers import TINY, assert_one_line_error, run
from helpers.interop import tiny_timm
from resdecay import alphas_of, decayify
from resdecay.errors import CheckpointError, UserError
from resdecay.eval.reports import protocol_text, values_text
from resdecay.eval.suite import EvalSettings
from resdecay.interop import (
    export_to_timm,
    from_pretrained,
    load_decayified,
    load_exported,
    load_weights,
    save_decayified,
    save_pretrained,
)
from resdecay.interop.import_weights import AlphaUnknownWarning, import_weights
from resdecay.interop.weights import SpecIgnoredWarning
from resdecay.models import FAMILIES, build_model, get_family, tiny_config
from resdecay.train.checkpoint import load_model

TIMM_KW = {"img_size": 32, "patch_size": 8, "depth": 4}
X32 = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # belt and braces: no test may reach a hub


def _randomised(model):
    """Every weight non-trivial (zero-initialised branches too), so equal outputs mean equal weights."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model.eval()


def _features(model, family):
    torch.manual_seed(1)  # the same example batch for both models
    batch = get_family(family).example_batch(model, 2)
    with torch.no_grad():
        return model.forward_features(batch.images, *batch.conditioning)


def _one_line(exc_info, *fragments):
    text = str(exc_info.value)
    assert "\n" not in text, text
    for f in fragments:
        assert f in text, text


# ----------------------------------------------------------------------------- every family
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_round_trip_every_family_equal_features(family, tmp_path):
    model = _randomised(build_model(tiny_config(family)))
    folder = save_pretrained(model, tmp_path / family)
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    back = from_pretrained(folder)
    config = back.resdecay_config
    # the family's own class, with save_pretrained / push_to_hub methods (tests/interop/test_sharing.py)
    assert not back.training and type(back)._resdecay_base is type(model) and isinstance(back, type(model))
    assert torch.equal(_features(back, family), _features(model, family))
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values(), strict=True))
    assert config["family"] == family and config["resdecay_version"] == resdecay.__version__
    assert config["alpha"]["factors"] == [[n, list(f)] for n, f in alphas_of(model)]
    assert config["alpha"]["alpha_eff"] == pytest.approx(resdecay.effective_decay(model.alphas))
    for key in ("alpha_min", "schedule", "shortcut", "decay_branches"):
        assert key in config["alpha"]
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: resdecay\n") and f"`{family}`" in card and "alpha_eff" in card


def test_learned_and_edited_alphas(tmp_path):
    """A learnable shortcut's trained alphas come back; an edited alpha_min is refused in one line."""
    cfg = tiny_config("mae")
    cfg.shortcut = "learnable"
    model = _randomised(build_model(cfg))
    save_pretrained(model, tmp_path / "learned")
    back = from_pretrained(tmp_path / "learned")
    config = back.resdecay_config
    assert alphas_of(back) == alphas_of(model) and torch.equal(_features(back, "mae"), _features(model, "mae"))
    save_pretrained(_randomised(build_model(tiny_config("mae"))), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["model"]["alpha_min"] = 0.8
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as info:
        from_pretrained(tmp_path / "m")
    _one_line(info, "config.json says model.alpha_min = 0.8", "model.safetensors says 0.6", "edited")  # its metadata


# ----------------------------------------------------------------------------- a trained run and its card
@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """A 1-epoch tiny digits run, evaluated by resdecay eval (eval/eval.json in the run folder)."""
    from resdecay.commands.evaluate import run_eval
    from resdecay.train import train
    from resdecay.train.config import load_config

    root = tmp_path_factory.mktemp("run")
    cfg = load_config("mae-tiny-digits", [*TINY, "train.epochs=1", f"train.out_dir={root / 'run'}"])
    ckpt = train(cfg, progress=False)["checkpoint"]
    run_eval([ckpt], EvalSettings(metric_options={"probe": {"epochs": 2}}, max_train=300, max_test=100, progress=False))
    return root / "run", ckpt


@pytest.mark.slow
def test_card_of_a_trained_run_names_every_numbers_protocol(evaluated_run, tmp_path):
    run_dir, ckpt = evaluated_run
    model, cfg = load_model(ckpt)
    folder = save_pretrained(model, tmp_path / "mae-digits", run_dir=run_dir)
    report = json.loads((run_dir / "eval" / "eval.json").read_text())
    card = (folder / "README.md").read_text()
    rows = [*report["results"], *report["baselines"]]
    assert len(rows) >= 8
    table = [ln for ln in card.splitlines() if ln.startswith("| ") and re.search(r"\| (top1|effective_rank) ", ln)]
    assert len(table) == len(rows)  # one table line per number, no more
    for row in rows:  # each value on a line with its protocol: data, split sizes and the metric's card
        assert any(values_text(row) in ln and ln.rstrip(" |").endswith(protocol_text(row)) for ln in table), row
    assert "digits train 300 -> test 100; k=20 T=0.07" in card and "in100 recipe, 2 epochs" in card
    summary = json.loads((run_dir / "summary.json").read_text())
    assert f"{summary['steps']} optimizer steps, train.epochs=1 over 1437 images, effective batch 64" in card
    assert "| preset | mae-tiny-digits |" in card and "digits (augmentation none" in card
    assert f"alpha_eff | {summary['alpha_eff']:.4g}:" in card and "| alpha_min | 0.6 |" in card
    config = json.loads((folder / "config.json").read_text())
    assert config["preset"] == "mae-tiny-digits" and config["data"]["name"] == "digits"
    assert config["training"]["steps"] == summary["steps"] and config["evaluation"]["step"] == report["step"]
    assert json.loads((folder / "eval.json").read_text())["results"] == report["results"]
    back = from_pretrained(folder)
    assert torch.equal(_features(back, "mae"), _features(model, "mae"))


@pytest.mark.slow
def test_card_says_when_eval_measured_other_weights_and_refuses_another_model(evaluated_run, tmp_path):
    run_dir, ckpt = evaluated_run
    report = json.loads((run_dir / "eval" / "eval.json").read_text())
    other = dict(report, checkpoint_sha256="0" * 64, step=11)
    (tmp_path / "other.json").write_text(json.dumps(other))
    from resdecay.interop import export_to_hf

    folder = export_to_hf(ckpt, tmp_path / "hf", eval_json=tmp_path / "other.json", license="mit")
    card = (folder / "README.md").read_text()
    assert "**Note:** these numbers were measured on another checkpoint of the run (step 11)" in card
    assert "license: mit" in card and json.loads((folder / "config.json").read_text())["evaluation"]["matches_weights"] is False
    model, _ = load_model(ckpt)
    save_pretrained(model, folder)  # an earlier save is overwritten, its report with it: it described those weights
    assert not (folder / "eval.json").exists() and "No evaluation was given" in (folder / "README.md").read_text()
    wrong = dict(report, model={**report["model"], "alpha_min": 0.9})
    (tmp_path / "wrong.json").write_text(json.dumps(wrong))
    with pytest.raises(UserError) as info:
        save_pretrained(model, tmp_path / "x", eval_json=tmp_path / "wrong.json")
    _one_line(info, "measured another model", "model.alpha_min")


@pytest.mark.slow
def test_export_to_hf_cli_and_back_to_timm(evaluated_run, tmp_path, capsys):
    run_dir, ckpt = evaluated_run
    code, out, err = run(capsys, "export", str(ckpt), "--to", "hf", "--out", str(tmp_path / "hf"))
    assert code == 0, err
    assert "resdecay.from_pretrained" in out and (tmp_path / "hf" / "eval.json").is_file()
    model, _ = load_model(ckpt)
    back = from_pretrained(tmp_path / "hf")
    config = back.resdecay_config
    assert torch.equal(_features(back, "mae"), _features(model, "mae"))
    assert config["weights"]["step"] == config["training"]["steps"] and config["evaluation"]["matches_weights"] is True
    code, out, err = run(capsys, "export", str(tmp_path / "hf"), "--to", "timm", "--out", str(tmp_path / "v.safetensors"))
    assert code == 0, err
    vit = load_exported(tmp_path / "v.safetensors")
    encoder = [tuple(factors) for name, factors in config["alpha"]["factors"] if name.startswith("blocks.")]
    assert [factors for _, factors in alphas_of(vit)] == encoder
    assert vit.resdecay_spec["alpha_min"] == 0.6


@pytest.mark.slow
def test_export_cli_refuses_bad_inputs_in_one_line(evaluated_run, tmp_path, capsys):
    run_dir, ckpt = evaluated_run
    (tmp_path / "bad.pt").write_bytes(Path(ckpt).read_bytes()[:3000])
    (tmp_path / "file").write_text("x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    (tmp_path / "garbage.json").write_text("{not json")
    cases = [((str(tmp_path / "none.pt"), "--out", str(tmp_path / "o")), ("does not exist",)),
             ((str(tmp_path / "bad.pt"), "--out", str(tmp_path / "o")), ("truncated or damaged",)),
             ((str(ckpt), "--out", str(tmp_path / "file")), ("is a file",)),
             ((str(ckpt), "--out", str(tmp_path / "busy")), ("already holds other files",)),
             ((str(ckpt), "--out", str(tmp_path / "o"), "--eval-json", str(tmp_path / "garbage.json")), ("not a readable eval.json",)),
             ((str(ckpt), "--out", str(tmp_path / "o"), "--ema"), ("holds no EMA weights",))]
    for args, fragments in cases:
        code, _, err = run(capsys, "export", args[0], "--to", "hf", *args[1:])
        assert_one_line_error(code, err, *fragments)
    assert not (tmp_path / "o").exists()  # nothing half written


# ----------------------------------------------------------------------------- decayified timm / torchvision
def test_decayified_timm_vit_keeps_alpha(tmp_path):
    vit = decayify(tiny_timm(), alpha_min=0.6, schedule="cosine", branches="mlp")
    with pytest.raises(UserError) as info:  # the default vit_tiny_patch16_224 is 224 px: its weights do not fit
        save_pretrained(vit, tmp_path / "no-kwargs")
    _one_line(info, "pos_embed", "model_kwargs")
    folder = save_pretrained(vit, tmp_path / "vit", model_kwargs=TIMM_KW)
    back = from_pretrained(folder)
    config = back.resdecay_config
    assert config["kind"] == "decayified" and config["resdecay_architecture"] == {"library": "timm", "name": "vit_tiny_patch16_224",
                                                                        "kwargs": TIMM_KW}
    assert back.resdecay_spec == vit.resdecay_spec == config["resdecay_spec"] and alphas_of(back) == alphas_of(vit)
    with torch.no_grad():
        assert torch.equal(back(X32), vit(X32))
    save_pretrained(back, tmp_path / "again")  # the loaded model knows how it was built
    assert json.loads((tmp_path / "again" / "config.json").read_text())["resdecay_architecture"]["kwargs"] == TIMM_KW
    card = (folder / "README.md").read_text()
    assert "timm `vit_tiny_patch16_224`" in card and '"schedule": "cosine"' in card and "| decay_branches | mlp |" in card
    # the bare weights file carries the spec too
    fresh = tiny_timm(seed=5)
    load_decayified(folder / "model.safetensors", fresh)
    with torch.no_grad():
        assert torch.equal(fresh(X32), vit(X32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_weights(tiny_timm(seed=5), folder / "model.safetensors")
    assert [w.category for w in caught] == [SpecIgnoredWarning]


def test_decayified_torchvision_resnet_round_trip(tmp_path):
    import torchvision

    torch.manual_seed(0)
    net = decayify(torchvision.models.resnet18(num_classes=10), alpha_min=0.7).eval()
    with pytest.raises(UserError) as info:
        save_pretrained(net, tmp_path / "r")
    _one_line(info, "architecture='resnet18'")
    folder = save_pretrained(net, tmp_path / "r", architecture="resnet18", model_kwargs={"num_classes": 10})
    back = from_pretrained(folder)
    config = back.resdecay_config
    assert alphas_of(back) == alphas_of(net) and config["alpha"]["alpha_min"] == 0.7
    with torch.no_grad():
        assert torch.equal(back(X32), net(X32))


# ----------------------------------------------------------------------------- the alpha in every format
def test_missing_alpha_spec_is_refused_or_warned_in_one_line(tmp_path, capsys):
    folder = save_pretrained(decayify(tiny_timm(), alpha_min=0.6), tmp_path / "vit", model_kwargs=TIMM_KW)
    config = json.loads((folder / "config.json").read_text())
    for drop, fragment in (("alpha", "carries no alpha section"), ("resdecay_spec", "carries no resdecay_spec")):
        (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != drop}))
        with pytest.raises(CheckpointError) as info:
            from_pretrained(folder)
        _one_line(info, fragment, "save it again with resdecay.save_pretrained")
    with pytest.raises(UserError) as info:  # a model that is neither resdecay's nor decayified
        save_pretrained(tiny_timm(), tmp_path / "plain")
    _one_line(info, "resdecay.decayify(model, alpha_min=...) first")
    # save_decayified in safetensors: the spec is in the metadata; a file stripped of it is refused
    from safetensors.torch import load_file, save_file

    path = save_decayified(decayify(tiny_timm(), alpha_min=0.6), tmp_path / "d.safetensors", extra={"epoch": 3})
    fresh = load_decayified(path, tiny_timm(seed=2))
    assert fresh.resdecay_spec == {"alpha_min": 0.6, "schedule": "linear", "branches": "both"}
    save_file(load_file(path), tmp_path / "stripped.safetensors")
    with pytest.raises(CheckpointError) as info:
        load_decayified(tmp_path / "stripped.safetensors", tiny_timm())
    _one_line(info, "carries no resdecay_spec", "save_decayified")


def test_timm_export_carries_alpha_and_import_without_it_warns(tmp_path, capsys):
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from helpers.interop import resdecay_checkpoint

    resdecay_checkpoint(tmp_path / "c.pt", "mae-tiny-digits", ["model.in_chans=3", "model.img_size=32", "model.patch_size=8"])
    export_to_timm(tmp_path / "c.pt", tmp_path / "v.safetensors")
    with safe_open(str(tmp_path / "v.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert json.loads(meta["resdecay_spec"])["alpha_min"] == 0.6
    save_file(load_file(tmp_path / "v.safetensors"), tmp_path / "bare.safetensors", metadata={k: v for k, v in meta.items()
                                                                                             if k != "resdecay_spec"})
    with pytest.raises(CheckpointError) as info:
        load_exported(tmp_path / "bare.safetensors")
    _one_line(info, "carries no resdecay_spec", "export it again")
    # a timm file without a spec imports as a plain model, with one line saying so and how to fix it
    with pytest.warns(AlphaUnknownWarning, match="--alpha-min"):
        import_weights(tmp_path / "bare.safetensors", "timm-vit", "mae-tiny-digits", tmp_path / "imp.pt")
    code, out, err = run(capsys, "import-weights", str(tmp_path / "bare.safetensors"), "--format", "timm-vit", "--preset",
                         "mae-tiny-digits", "--out", str(tmp_path / "imp2.pt"))
    assert code == 0, err
    warned = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1 and "plain alpha 1 model" in warned[0] and "--alpha-min" in warned[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a plain model said to be plain: nothing to warn about
        import_weights(tmp_path / "bare.safetensors", "timm-vit", "mae-tiny-digits", tmp_path / "imp3.pt", alpha_min=1.0)


# ----------------------------------------------------------------------------- damaged folders, the hub
def test_corrupted_or_missing_files_are_one_line_exit_2(tmp_path, capsys):
    model = _randomised(build_model(tiny_config("mae")))
    cases = {"no weights": (lambda f: (f / "model.safetensors").unlink(), "holds no model.safetensors"),
             "no config": (lambda f: (f / "config.json").unlink(), "holds no config.json"),
             "truncated weights": (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:500]),
                                   "not a readable safetensors file"),
             "bad json": (lambda f: (f / "config.json").write_text("{\"format\": "), "not a readable config.json"),
             "foreign config": (lambda f: (f / "config.json").write_text('{"architectures": ["BertModel"]}'),
                                "not written by resdecay.save_pretrained"),
             "unknown family": (lambda f: (f / "config.json").write_text(
                 (f / "config.json").read_text().replace('"family": "mae"', '"family": "toy"', 1)), "'toy' is not registered")}
    for name, (damage, fragment) in cases.items():
        folder = save_pretrained(model, tmp_path / name.replace(" ", "-"))
        damage(folder)
        with pytest.raises(CheckpointError) as info:
            from_pretrained(folder)
        _one_line(info, fragment)
        code, _, err = run(capsys, "export", str(folder), "--to", "timm", "--out", str(tmp_path / "x.safetensors"))
        assert_one_line_error(code, err, fragment)
    for bad, fragment in ((tmp_path / "nowhere" / "deep" / "x", "neither a folder nor a hub id"),
                          (folder / "README.md", "is a file")):
        with pytest.raises(CheckpointError) as info:
            from_pretrained(bad)
        _one_line(info, fragment)


def test_hub_id_goes_through_snapshot_download_only(tmp_path, monkeypatch):
    """A hub id is resolved by huggingface_hub (faked here: no network); a folder never is."""
    import huggingface_hub

    model = _randomised(build_model(tiny_config("resnet")))
    folder = save_pretrained(model, tmp_path / "rn")
    calls = []

    def fake_download(repo_id, **kw):
        calls.append((repo_id, kw))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    from_pretrained(folder)
    assert calls == []
    back = from_pretrained("someone/rn-tiny", revision="v1")
    assert calls[0][0] == "someone/rn-tiny" and calls[0][1]["revision"] == "v1"
    assert "model.safetensors" in calls[0][1]["allow_patterns"]
    assert torch.equal(_features(back, "resnet"), _features(model, "resnet"))

    def failing(repo_id, **kw):
        raise OSError("offline\nmode")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    with pytest.raises(CheckpointError) as info:
        from_pretrained("someone/missing")
    _one_line(info, "cannot download someone/missing", "offline mode")


def test_push_to_hub_uploads_a_checked_folder(tmp_path, monkeypatch):
    """push_to_hub with huggingface_hub's HfApi replaced by a recorder: nothing is pushed anywhere."""
    import huggingface_hub

    recorded = []

    class FakeApi:
        def __init__(self, token=None):
            recorded.append(("token", token))

        def create_repo(self, repo_id, **kw):
            recorded.append(("create", repo_id, kw))
            return f"https://hub.invalid/{repo_id}"

        def upload_folder(self, **kw):
            recorded.append(("upload", kw))

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    folder = save_pretrained(_randomised(build_model(tiny_config("mae"))), tmp_path / "m")
    assert resdecay.push_to_hub(folder, "me/m", private=True) == "https://hub.invalid/me/m"
    upload = recorded[-1][1]
    assert recorded[1] == ("create", "me/m", {"private": True, "exist_ok": True})
    assert upload["repo_id"] == "me/m" and upload["folder_path"] == str(folder)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError):  # a folder that does not load is not pushed
        resdecay.push_to_hub(folder, "me/m")
    assert len([r for r in recorded if r[0] == "upload"]) == 1
