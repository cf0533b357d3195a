"""alpha travels with the weights (save/load_decayified, bug 5) and export to timm (issue 13, item 3)."""

import warnings

import pytest
import torch
from safetensors.torch import load_file

from helpers import assert_one_line_error, run
from helpers.interop import resdecay_checkpoint, timm_blocks, tiny_timm
from resdecay import alphas_of, decayify
from resdecay.errors import CheckpointError
from resdecay.interop import load_decayified, load_exported, load_weights, save_decayified
from resdecay.interop.weights import SpecIgnoredWarning

X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def test_spec_is_stored_and_reapplied(tmp_path):
    src = decayify(tiny_timm(), alpha_min=0.6, branches="mlp")
    path = save_decayified(src, tmp_path / "d.pt")
    blob = torch.load(path, weights_only=True)
    assert blob["resdecay_spec"] == {"alpha_min": 0.6, "schedule": "linear", "branches": "mlp"}
    fresh = tiny_timm(seed=1)
    with torch.no_grad():
        assert not torch.allclose(fresh(X), src(X))
    load_decayified(path, fresh)
    with torch.no_grad():
        assert torch.equal(fresh(X), src(X))
    assert alphas_of(fresh) == alphas_of(src) and fresh.resdecay_spec == src.resdecay_spec


def test_plain_timm_load_still_works_key_for_key(tmp_path):
    src = decayify(tiny_timm(), alpha_min=0.6)
    save_decayified(src, tmp_path / "d.pt")
    plain = tiny_timm()
    result = plain.load_state_dict(torch.load(tmp_path / "d.pt", weights_only=True)["model"], strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert list(plain.state_dict()) == list(src.state_dict())


def test_loading_a_spec_into_a_plain_model_warns_once(tmp_path):
    save_decayified(decayify(tiny_timm(), alpha_min=0.6), tmp_path / "d.pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_weights(tiny_timm(), tmp_path / "d.pt")
    hits = [w for w in caught if issubclass(w.category, SpecIgnoredWarning)]
    assert len(hits) == 1 and "load_decayified" in str(hits[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when the target is decayified, or the file carries no spec
        load_weights(decayify(tiny_timm(), alpha_min=0.6), tmp_path / "d.pt")
        torch.save({"model": tiny_timm().state_dict()}, tmp_path / "plain.pt")
        load_weights(tiny_timm(), tmp_path / "plain.pt")


def test_a_compiled_model_saves_and_loads_under_its_own_keys(tmp_path):
    """Issue 38, item 5: save_decayified(torch.compile(model)) wrote _orig_mod. keys that load_decayified
    refused with a hint to build the model with other dimensions. (torch.compile compiles on the first call:
    nothing is compiled here.)"""
    src = decayify(tiny_timm(), alpha_min=0.6)
    for suffix in (".pt", ".safetensors"):
        path = save_decayified(torch.compile(src), tmp_path / f"c{suffix}")
        keys = list(torch.load(path, weights_only=True)["model"]) if suffix == ".pt" else list(load_file(path))
        assert sorted(keys) == sorted(src.state_dict()) and not any(k.startswith("_orig_mod.") for k in keys)
        fresh = tiny_timm(seed=1)
        load_decayified(path, fresh)
        with torch.no_grad():
            assert torch.equal(fresh(X), src(X))
    # a file an earlier version wrote from a compiled model, and a compiled model to load into
    old = {"format": "resdecay-decayified-v1", "resdecay_spec": src.resdecay_spec,
           "model": {f"_orig_mod.{k}": v for k, v in src.state_dict().items()}}
    torch.save(old, tmp_path / "old.pt")
    target = torch.compile(tiny_timm(seed=2))
    assert load_decayified(tmp_path / "old.pt", target) is target
    with torch.no_grad():
        assert torch.equal(target._orig_mod(X), src(X)) and alphas_of(target._orig_mod) == alphas_of(src)
    plain = tiny_timm(seed=3)
    with pytest.warns(SpecIgnoredWarning):
        load_weights(plain, tmp_path / "old.pt")
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in src.state_dict().items())
    # the shareable folder takes the compiled model too (it refused it, recommending save_decayified)
    from resdecay.interop import from_pretrained, save_pretrained
    save_pretrained(torch.compile(src), tmp_path / "folder", architecture="vit_tiny_patch16_224",
                    model_kwargs={"img_size": 32, "patch_size": 8, "depth": 4})
    with torch.no_grad():
        assert torch.equal(from_pretrained(tmp_path / "folder").eval()(X), src(X))


def test_loaders_refuse_mismatches_in_one_line(tmp_path):
    save_decayified(decayify(tiny_timm(), alpha_min=0.6), tmp_path / "d.pt")
    for target, fragment in ((tiny_timm(depth=3), "unexpected key"), (tiny_timm(embed_dim=96, num_heads=3), "shape mismatch")):
        with pytest.raises(CheckpointError, match=fragment) as info:
            load_decayified(tmp_path / "d.pt", target)
        assert "\n" not in str(info.value)
    torch.save({"model": tiny_timm().state_dict()}, tmp_path / "plain.pt")
    with pytest.raises(CheckpointError, match="carries no resdecay_spec"):
        load_decayified(tmp_path / "plain.pt", tiny_timm())
    blob = torch.load(tmp_path / "d.pt", weights_only=True)
    blob["resdecay_spec"]["alpha_min"] = 1.5
    torch.save(blob, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match=r"alpha_min must lie in \(0, 1\]"):
        load_decayified(tmp_path / "bad.pt", tiny_timm())
    with pytest.raises(CheckpointError, match="not decayified"):
        save_decayified(tiny_timm(), tmp_path / "x.pt")


@pytest.mark.parametrize("preset,extra", [("mae-tiny-digits", ["model.decay_branches=attn"]),
                                          ("mae-tiny-digits", ["model.schedule=paper"]),
                                          ("mae-tiny-digits-plain", [])])
def test_export_to_timm_features_match(capsys, tmp_path, preset, extra):
    model, cfg = resdecay_checkpoint(tmp_path / "c.pt", preset, ["model.in_chans=3", "model.img_size=32",
                                                                 "model.patch_size=8", *extra])
    code, out, err = run(capsys, "export", str(tmp_path / "c.pt"), "--to", "timm", "--out", str(tmp_path / "v.safetensors"))
    assert code == 0, err
    vit = load_exported(tmp_path / "v.safetensors")
    assert vit.resdecay_spec["alpha_min"] == cfg.model.alpha_min
    assert torch.equal(torch.tensor([a for _, a in alphas_of(vit)], dtype=torch.float64), model.alphas)
    with torch.no_grad():
        ours = model.forward_features(X)  # raw last block, cls first
        assert torch.allclose(timm_blocks(vit, X), ours, atol=1e-5)
        # timm's forward_features adds the final norm exactly where resdecay's encoder has one
        assert torch.allclose(vit.forward_features(X), model.norm(ours), atol=1e-5)
        # the eval pooling 'mean' (all tokens incl. cls) of both agree too
        assert torch.allclose(timm_blocks(vit, X).mean(1), ours.mean(1), atol=1e-5)


def test_export_refuses_what_timm_cannot_reproduce(capsys, tmp_path):
    resdecay_checkpoint(tmp_path / "l.pt", overrides=["model.shortcut=learnable"])
    code, _, err = run(capsys, "export", str(tmp_path / "l.pt"), "--to", "timm", "--out", str(tmp_path / "v.safetensors"))
    assert_one_line_error(code, err, "model.shortcut=learnable")
    code, _, err = run(capsys, "export", str(tmp_path / "l.pt"), "--to", "timm", "--out", str(tmp_path / "v.pt"))
    assert_one_line_error(code, err, "must end in .safetensors")
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, str(tmp_path / "other.safetensors"), metadata={"x": "y"})
    with pytest.raises(CheckpointError, match="was not written by resdecay export"):
        load_exported(tmp_path / "other.safetensors")


def test_help_ends_with_an_example(capsys):
    for cmd in ("import-weights", "export"):
        with pytest.raises(SystemExit):
            run(capsys, cmd, "--help")
        out = capsys.readouterr().out.rstrip()
        assert "example:" in out and out.splitlines()[-1].strip().startswith(("resdecay", "python"))
