"""Issue 23 (correctness sweep), interop items: every import format is checked against the file's own
metadata (23.2), a stored spec never re-initialises weights (23.3), one decayified model is safe to call
from several threads (23.7), and the smaller defects of 23.10 / 23.12 / 23.13.

Each test builds the foreign file it needs (nothing is downloaded) and fails on the code before the fix.
"""

import argparse
import contextlib
import copy
import json
import os
import stat
import threading
import warnings

import numpy as np
import pytest
import timm
import torch
import torchvision

from helpers import assert_one_line_error, run
from helpers.interop import authors_unet_layout, resdecay_checkpoint, same_mae_outputs, timm_blocks, tiny_timm
from resdecay import alphas_of, decayify
from resdecay.interop import load_decayified, load_exported, save_decayified
from resdecay.nn.adapters.fused import hooks_only
from resdecay.train.checkpoint import load_model

RGB = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
HEADS = ["model.num_heads=2", "model.decoder_num_heads=2"]  # the tiny test models' heads, where a file does not say
RGB32 = ["model.in_chans=3", "model.img_size=32", "model.patch_size=8"]


def _import(capsys, src, fmt, out, *extra):
    return run(capsys, "import-weights", str(src), "--format", fmt, "--out", str(out), *extra)


# ----------------------------------------------------------------------------- 23.2: unet-mae
def test_unet_mae_takes_alpha_from_the_files_args(capsys, tmp_path):
    """issue 23.2: the authors' script saves args.min_decay; it was ignored (--alpha-min required, and a
    wrong --alpha-min silently wrote another network)."""
    src, _ = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits", ["alpha_min=0.6", "model.mask_ratio=0.5"])
    args = argparse.Namespace(model="unet_mae_custom", min_decay=0.6, mask_ratio=0.5, norm_pix_loss=True, input_size=8,
                              blr=1.5e-4)
    torch.save({"model": authors_unet_layout(src.state_dict()), "epoch": 399, "args": args}, tmp_path / "unet.pth")
    base = [tmp_path / "unet.pth", "unet-mae", tmp_path / "imp.pt", "--preset", "mae-tiny-digits", *HEADS]
    code, _, err = _import(capsys, *base)
    assert code == 0, err
    model, cfg = load_model(tmp_path / "imp.pt")
    assert (cfg.model.alpha_min, cfg.model.mask_ratio, cfg.model.schedule) == (0.6, 0.5, "linear")
    assert torch.equal(model.alphas, src.alphas) and same_mae_outputs(src, model)
    assert "args.min_decay" in torch.load(tmp_path / "imp.pt", weights_only=True)["imported_from"]["stated_by_file"]["alpha_min"]
    # the same value as a flag is fine; a contradicting one is refused in one line and writes nothing
    (tmp_path / "imp.pt").unlink()
    assert _import(capsys, *base, "--alpha-min", "0.6")[0] == 0
    (tmp_path / "imp.pt").unlink()
    code, _, err = _import(capsys, *base, "--alpha-min", "0.7")
    assert_one_line_error(code, err, "stores alpha_min 0.6 but --alpha-min is 0.7", "args.min_decay", "drop --alpha-min")
    assert_one_line_error(*_import(capsys, *base, "model.alpha_min=0.7")[::2], "args.min_decay", "drop model.alpha_min")
    assert_one_line_error(*_import(capsys, *base, "model.mask_ratio=0.75")[::2], "args.mask_ratio", "drop the override")
    assert not (tmp_path / "imp.pt").exists()


def test_unet_mae_file_without_args_needs_the_flag_and_a_damaged_args_is_refused(capsys, tmp_path):
    """issue 23.2: --alpha-min is required only when the file carries no args."""
    src, _ = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits", ["alpha_min=0.7"])
    theirs = authors_unet_layout(src.state_dict())
    torch.save({"model": theirs}, tmp_path / "bare.pth")
    out = tmp_path / "imp.pt"
    assert_one_line_error(*_import(capsys, tmp_path / "bare.pth", "unet-mae", out, "--preset", "mae-tiny-digits", *HEADS)[::2],
                          "needs --alpha-min", "carries no args.min_decay")
    cases = [({"args": argparse.Namespace(min_decay=1.7)}, "args.min_decay is 1.7"),
             ({"args": argparse.Namespace(min_decay=0.7, input_size=16)}, "args.input_size says model.img_size = 16"),
             ({"args": argparse.Namespace(min_decay=0.7), "resdecay_spec": {"alpha_min": 0.6}},
              "args.min_decay says model.alpha_min = 0.7 but its resdecay_spec says 0.6")]
    for i, (extra, fragment) in enumerate(cases):
        torch.save({"model": theirs, **extra}, tmp_path / f"bad{i}.pth")
        assert_one_line_error(*_import(capsys, tmp_path / f"bad{i}.pth", "unet-mae", out, "--preset", "mae-tiny-digits",
                                       *HEADS)[::2], fragment)
    assert not out.exists()


# ----------------------------------------------------------------------------- 23.2: mae
def test_official_mae_takes_heads_loss_and_mask_ratio_from_its_args(capsys, tmp_path):
    """issue 23.2 (mae): facebookresearch/mae's main_pretrain.py saves args (model name, mask ratio,
    norm_pix_loss, input size); they were ignored and the heads had to be given by hand."""
    src, _ = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits-plain",
                                 ["model.embed_dim=192", "model.depth=12", "model.num_heads=3", "model.mask_ratio=0.5",
                                  "model.norm_pix_loss=false"])
    args = argparse.Namespace(model="mae_vit_tiny_patch2", input_size=8, mask_ratio=0.5, norm_pix_loss=False, epochs=800)
    torch.save({"model": src.state_dict(), "args": args, "epoch": 799}, tmp_path / "mae.pth")
    code, _, err = _import(capsys, tmp_path / "mae.pth", "mae", tmp_path / "imp.pt", "--preset", "mae-tiny-digits-plain",
                           "model.decoder_num_heads=2")
    assert code == 0, err
    model, cfg = load_model(tmp_path / "imp.pt")
    assert (cfg.model.num_heads, cfg.model.mask_ratio, cfg.model.norm_pix_loss, cfg.model.alpha_min) == (3, 0.5, False, 1.0)
    assert same_mae_outputs(src, model)
    code, _, err = _import(capsys, tmp_path / "mae.pth", "mae", tmp_path / "x.pt", "--preset", "mae-tiny-digits-plain",
                           "model.decoder_num_heads=2", "model.num_heads=4")
    assert_one_line_error(code, err, "args.model 'mae_vit_tiny_patch2'", "model.num_heads = 3", "drop the override")
    # a model name that contradicts the weights: the file contradicts itself
    torch.save({"model": src.state_dict(), "args": argparse.Namespace(model="mae_vit_base_patch16")}, tmp_path / "bad.pth")
    assert_one_line_error(*_import(capsys, tmp_path / "bad.pth", "mae", tmp_path / "x.pt", "--preset", "mae-tiny-digits-plain",
                                   "model.decoder_num_heads=2")[::2], "model.embed_dim = 768 but its weights have 192")
    assert not (tmp_path / "x.pt").exists()


# ----------------------------------------------------------------------------- 23.2: timm-vit
def test_timm_training_checkpoint_gives_its_heads(capsys, tmp_path):
    """issue 23.2 (timm-vit): timm's train.py saves args.model (+ --model-kwargs); the heads it
    implies are used, and a name that contradicts the weights is refused."""
    vit = tiny_timm(num_classes=10)
    args = argparse.Namespace(model="vit_tiny_patch16_224", model_kwargs={"img_size": 32, "patch_size": 8, "depth": 4},
                              num_classes=10, gp=None)
    torch.save({"epoch": 3, "arch": "visiontransformer", "state_dict": vit.state_dict(), "version": 2, "args": args,
                "metric": np.float64(0.5)}, tmp_path / "timm.pth.tar")
    code, _, err = _import(capsys, tmp_path / "timm.pth.tar", "timm-vit", tmp_path / "imp.pt", "--preset", "mae-tiny-digits",
                           "model.decoder_embed_dim=32", "model.decoder_num_heads=2")
    assert code == 0, err
    model, cfg = load_model(tmp_path / "imp.pt")
    assert cfg.model.encoder_config().num_heads == 3
    with torch.no_grad():
        assert torch.allclose(model(RGB), vit(RGB), atol=1e-5)
    args.model, args.model_kwargs = "vit_small_patch16_224", {}
    torch.save({"state_dict": vit.state_dict(), "args": args}, tmp_path / "bad.pth.tar")
    assert_one_line_error(*_import(capsys, tmp_path / "bad.pth.tar", "timm-vit", tmp_path / "x.pt", "--preset", "mae-tiny-digits",
                                   "model.num_heads=3")[::2], "args.model 'vit_small_patch16_224'", "contradicts itself")


def test_exported_safetensors_imports_with_its_spec_and_heads(capsys, tmp_path):
    """issue 23.2 (timm-vit, safetensors): a `resdecay export` file (or a timm hub model.safetensors)
    was unreadable for import-weights; its metadata now gives alpha, schedule and heads."""
    src, _ = resdecay_checkpoint(tmp_path / "c.pt", "mae-tiny-digits", [*RGB32, "model.schedule=cosine"])
    assert run(capsys, "export", str(tmp_path / "c.pt"), "--to", "timm", "--out", str(tmp_path / "v.safetensors"))[0] == 0
    code, _, err = _import(capsys, tmp_path / "v.safetensors", "timm-vit", tmp_path / "imp.pt", "--preset", "mae-tiny-digits",
                           "model.decoder_num_heads=2")
    assert code == 0, err
    model, cfg = load_model(tmp_path / "imp.pt")
    assert (cfg.model.alpha_min, cfg.model.schedule, cfg.model.num_heads) == (0.6, "cosine", 2)
    assert torch.equal(model.alphas, src.alphas)
    with torch.no_grad():
        assert torch.allclose(model.forward_features(RGB), src.forward_features(RGB), atol=1e-5)
    assert_one_line_error(*_import(capsys, tmp_path / "v.safetensors", "timm-vit", tmp_path / "x.pt", "--preset",
                                   "mae-tiny-digits", "--alpha-min", "0.8")[::2], "stores alpha_min 0.6 but --alpha-min is 0.8")
    # a timm hub model.safetensors (metadata {"format": "pt"}): weights only, heads from the command line
    from safetensors.torch import save_file

    vit = tiny_timm(num_classes=10)
    save_file(vit.state_dict(), str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    code, _, err = _import(capsys, tmp_path / "model.safetensors", "timm-vit", tmp_path / "hub.pt", "--preset", "mae-tiny-digits",
                           "model.num_heads=3")
    assert code == 0, err
    with torch.no_grad():
        assert torch.allclose(load_model(tmp_path / "hub.pt")[0](RGB), vit(RGB), atol=1e-5)


# ----------------------------------------------------------------------------- 23.3: spec never re-inits
def _trained(model):
    """Weights as training leaves them: the zero-initialised layers are no longer zero."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    return model


@pytest.mark.parametrize("which", ["timm", "resnet"])
def test_reapplying_the_stored_spec_keeps_trained_weights(tmp_path, which):
    """issue 23.3: decayify(model, **model.resdecay_spec) zeroed every attn.proj / fc2 (resnet: last BN)."""
    torch.manual_seed(0)
    plain = tiny_timm() if which == "timm" else torchvision.models.resnet18(num_classes=10).eval()
    model = _trained(decayify(plain, alpha_min=0.6, zero_init=True))
    x = RGB if which == "timm" else RGB[:1]
    with torch.no_grad():
        want = model(x)
        assert "zero_init" not in model.resdecay_spec
        decayify(model, **model.resdecay_spec)
        assert torch.equal(model(x), want)
        save_decayified(model, tmp_path / "d.pt")  # save -> load -> the same outputs
        fresh = tiny_timm(seed=1) if which == "timm" else torchvision.models.resnet18(num_classes=10).eval()
        load_decayified(tmp_path / "d.pt", fresh)
        assert torch.equal(fresh(x), want)
        assert torch.equal(decayify(fresh, **fresh.resdecay_spec)(x), want)


def test_old_files_with_zero_init_true_load_without_zeroing(tmp_path):
    """issue 23.3: files written before the fix carry zero_init: true in their spec."""
    model = _trained(decayify(tiny_timm(), alpha_min=0.6))
    torch.save({"format": "resdecay-decayified-v1", "model": model.state_dict(),
                "resdecay_spec": {"alpha_min": 0.6, "schedule": "linear", "zero_init": True, "branches": "both"}},
               tmp_path / "old.pt")
    with torch.no_grad():
        fresh = load_decayified(tmp_path / "old.pt", tiny_timm(seed=1))
        assert torch.equal(fresh(RGB), model(RGB))
        assert fresh.resdecay_spec == {"alpha_min": 0.6, "schedule": "linear", "branches": "both"}
        assert torch.equal(decayify(fresh, **fresh.resdecay_spec)(RGB), model(RGB))


def test_export_metadata_spec_reapplies_without_zeroing(capsys, tmp_path):
    """issue 23.3: the exported spec said zero_init: true (the MAE preset's init), so re-applying it to
    the loaded timm model wiped its weights."""
    src, _ = resdecay_checkpoint(tmp_path / "c.pt", "mae-tiny-digits", RGB32)  # zero_init: true in its config
    assert run(capsys, "export", str(tmp_path / "c.pt"), "--to", "timm", "--out", str(tmp_path / "v.safetensors"))[0] == 0
    from safetensors import safe_open

    with safe_open(str(tmp_path / "v.safetensors"), framework="pt") as f:
        assert "zero_init" not in json.loads(f.metadata()["resdecay_spec"])
    vit = load_exported(tmp_path / "v.safetensors")
    with torch.no_grad():
        want = timm_blocks(vit, RGB)
        assert torch.allclose(want, src.forward_features(RGB), atol=1e-5)
        assert torch.equal(timm_blocks(decayify(vit, **vit.resdecay_spec), RGB), want)


# ----------------------------------------------------------------------------- 23.7: threads
def _threaded_outputs(model, inputs, threads=4, calls=30):
    """Run ``model`` from ``threads`` threads at once, ``calls`` forwards each; returns the problems."""
    with torch.no_grad():
        want = [model(x) for x in inputs]
    problems, barrier = [], threading.Barrier(threads)

    def work(i):
        try:
            barrier.wait()
            with torch.no_grad():
                for _ in range(calls):
                    if not torch.equal(model(inputs[i]), want[i]):
                        problems.append(f"thread {i}: output differs from the single-threaded one")
        except Exception as e:  # KeyError('_resdecay_pending') before the fix
            problems.append(repr(e))

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return problems


@pytest.mark.parametrize("which", ["timm", "resnet"])
def test_one_decayified_model_called_from_four_threads(which):
    """issue 23.7: 4 threads x 30 forwards on one decayified timm ViT raised KeyError('_resdecay_pending')."""
    torch.manual_seed(0)
    model = decayify(tiny_timm() if which == "timm" else torchvision.models.resnet18(num_classes=10).eval(), alpha_min=0.5)
    size = 32 if which == "timm" else 16
    inputs = [torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    torch.set_num_threads(1)  # the threads interleave in Python, not inside one op
    assert not _threaded_outputs(model, inputs)
    assert not any(k.startswith("_resdecay_pending") for m in model.modules() for k in vars(m))


def _replica(module):
    """What torch.nn.DataParallel runs on each GPU: ``_replicate_for_data_parallel`` copies of every
    module (attributes and hook tables shared with the original), here with the same CPU parameters."""
    r = module._replicate_for_data_parallel()
    r._parameters = dict(module._parameters)
    r._modules = {k: _replica(c) if c is not None else None for k, c in module._modules.items()}
    return r


def test_data_parallel_replicas_run_in_threads():
    """issue 23.7 (a threaded data-parallel wrapper): a replica's drop_path hook looked for the pending
    input on the *original* norm module: KeyError even with one replica."""
    model = decayify(tiny_timm(), alpha_min=0.5)
    replicas = [_replica(model) for _ in range(2)]
    inputs = [RGB, RGB.flip(0)]
    with torch.no_grad():
        want = [model(x) for x in inputs]
        assert all(torch.equal(r(x), w) for r, x, w in zip(replicas, inputs, want, strict=True))
    torch.set_num_threads(1)
    assert not _threaded_outputs(replicas[0], inputs, threads=2, calls=10)


# ----------------------------------------------------------------------------- 23.10
def test_hybrid_timm_model_warns_once_naming_what_was_left():
    """issue 23.10: vit_small_r26_s32_224's ResNet stem was left undecayed without a word."""
    from resdecay.nn.decayify import PartialDecayWarning

    model = timm.create_model("vit_small_r26_s32_224", pretrained=False, depth=2, img_size=64, embed_dim=64, num_heads=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decayify(model, alpha_min=0.6)
    hits = [w for w in caught if issubclass(w.category, PartialDecayWarning)]
    assert len(hits) == 1, [str(w.message) for w in caught]
    text = str(hits[0].message)
    assert "decayed 2 block(s)" in text and "patch_embed.backbone.stages.0.blocks.0" in text and "resnetv2.Bottleneck" in text
    assert [n for n, _ in alphas_of(model)] == ["blocks.0", "blocks.1"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # alpha 1 changes nothing: nothing to warn about; plain ViTs never warn
        decayify(model, alpha_min=1.0)
        decayify(tiny_timm(), alpha_min=0.6)
    # the stem alone is a ResNetV2, whose blocks have an adapter since issue 31: decayed, one add each
    stem = decayify(model.patch_embed.backbone, alpha_min=0.6)
    assert [a for _, a in alphas_of(stem)][-1] == (0.6,)
    # a block no adapter names is reached by tracing (ParallelThingsBlock), one the trace cannot prove is refused
    traced = decayify(timm.models.vision_transformer.ParallelThingsBlock(16, 2), alpha_min=0.6)
    assert [a for _, a in alphas_of(traced)] == [(1.0, 0.6)]
    with pytest.raises(TypeError, match=r"in Bottleneck: Bottleneck \(traced adapter: .*a projection or a scale\)\); "
                                        r"nearest supported: timm .*supported kinds: docs/coverage.md"):
        decayify(timm.models.regnet.Bottleneck(8, 16, stride=2), alpha_min=0.6)


def test_exported_safetensors_gets_the_same_mode_as_other_outputs(capsys, tmp_path):
    """issue 23.10: `export` wrote its .safetensors with mode 0600 while checkpoints get 0644."""
    old = os.umask(0o022)
    try:
        resdecay_checkpoint(tmp_path / "c.pt", "mae-tiny-digits", RGB32)
        assert run(capsys, "export", str(tmp_path / "c.pt"), "--to", "timm", "--out", str(tmp_path / "v.safetensors"))[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "v.safetensors").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "c.pt").stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


# ----------------------------------------------------------------------------- 23.12 / 23.13
@pytest.mark.parametrize("where", ["file_as_folder", "sys"])
def test_unwritable_out_is_one_line_for_import_and_export(capsys, tmp_path, where):
    """issue 23.12: an unwritable --out for import-weights and export ended in a traceback."""
    src, _ = resdecay_checkpoint(tmp_path / "c.pt", "mae-tiny-digits-plain", RGB32)
    torch.save({"model": src.state_dict()}, tmp_path / "mae.pth")
    (tmp_path / "a_file").write_text("x")
    folder = tmp_path / "a_file" if where == "file_as_folder" else "/sys"  # /sys refuses writes, also to root
    code, _, err = _import(capsys, tmp_path / "mae.pth", "mae", f"{folder}/imp.pt", "--preset", "mae-tiny-digits-plain", *HEADS)
    assert_one_line_error(code, err, f"cannot write --out {folder}/imp.pt")
    code, _, err = run(capsys, "export", str(tmp_path / "c.pt"), "--to", "timm", "--out", f"{folder}/v.safetensors")
    assert_one_line_error(code, err, f"cannot write --out {folder}/v.safetensors")


def test_out_folder_is_made_when_written_and_not_by_a_failing_import(capsys, tmp_path):
    """issue 23.12: --out is checked before the work, without leaving an empty folder when the import fails."""
    src, _ = resdecay_checkpoint(tmp_path / "c.pt", "mae-tiny-digits-plain")
    torch.save({"model": src.state_dict()}, tmp_path / "mae.pth")
    code, _, err = _import(capsys, tmp_path / "mae.pth", "mae", tmp_path / "new" / "imp.pt", "--preset", "mae-tiny-digits-plain")
    assert_one_line_error(code, err, "model.num_heads=N")  # the heads are not in this file
    assert not (tmp_path / "new").exists()
    code, _, err = _import(capsys, tmp_path / "mae.pth", "mae", tmp_path / "new" / "sub" / "imp.pt", "--preset",
                           "mae-tiny-digits-plain", *HEADS)
    assert code == 0 and (tmp_path / "new" / "sub" / "imp.pt").is_file(), err


def test_export_ema_without_ema_and_import_of_a_folder_are_refused(capsys, tmp_path):
    """issue 23.12: `export --ema` of a run without EMA silently exported the raw weights; issue 23.13:
    import-weights of a folder said the file 'does not exist'."""
    resdecay_checkpoint(tmp_path / "c.pt", "mae-tiny-digits", RGB32)
    code, _, err = run(capsys, "export", str(tmp_path / "c.pt"), "--to", "timm", "--ema", "--out", str(tmp_path / "v.safetensors"))
    assert_one_line_error(code, err, "holds no EMA weights", "drop --ema")
    assert not (tmp_path / "v.safetensors").exists()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "checkpoint-799.pth").write_bytes(b"")
    code, _, err = _import(capsys, run_dir, "mae", tmp_path / "imp.pt", "--preset", "mae-tiny-digits-plain")
    assert_one_line_error(code, err, f"{run_dir} is a folder", "checkpoint-799.pth")
    assert "does not exist" not in err


@pytest.mark.parametrize("mechanism", ["hooks", "fused"])
def test_a_copy_gets_its_own_slots_and_alphas(mechanism):
    """issue 23.7 keeps the deepcopy independence (EMA, torch.compile): with the hooks, the copy's norm / drop_path
    pairs get their own keys; with the fused add (decayify's default for timm's blocks), the copy's forward is bound to
    the copy; either way a factor changed on the copy leaves the original alone."""
    with hooks_only() if mechanism == "hooks" else contextlib.nullcontext():
        model = decayify(tiny_timm(), alpha_min=0.5)
    twin = copy.deepcopy(model)
    a, b = (m.blocks[1] for m in (model, twin))  # blocks[0]'s attention add keeps alpha 1: no hooks
    if mechanism == "hooks":
        assert a.norm1.__dict__["_resdecay_slot"] is a.drop_path1.__dict__["_resdecay_slot"]
        assert b.norm1.__dict__["_resdecay_slot"] is b.drop_path1.__dict__["_resdecay_slot"]
        assert a.norm1.__dict__["_resdecay_slot"] is not b.norm1.__dict__["_resdecay_slot"]
    else:
        assert a.forward.block is a and b.forward.block is b
    b.drop_path1.resdecay_alpha = 0.1
    with torch.no_grad():
        assert not torch.allclose(model(RGB), twin(RGB))
