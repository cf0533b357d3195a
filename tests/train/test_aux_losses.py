"""Issue 52 item 4: REPA and the dispersive loss beside the diffusion families' denoising loss (``train.aux``).

The formulas are checked against the references re-typed in a few lines on the same random tensors:
sihyun-yu/REPA at 2b8c181a40fcf9d1954fe8a09bfec22cf90e1a5b (``loss.py`` SILoss's proj_loss, ``models/sit.py``
build_mlp) and whaletech-ai/Disperse-Loss at 24a50442d9ba219b3205f66f95c91b4a605e4e95
(``transport/transport.py`` Transport.disp_loss, added to the loss with weight 0.25 in training_losses)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import assert_one_line_error, run
from resdecay.commands.aux_target import load_aux_target
from resdecay.diffusion.aux_losses import dispersive_loss, repa_loss, repa_projector
from resdecay.models import build_model
from resdecay.train import checkpoint as ckpt
from resdecay.train import train
from resdecay.train.config import load_config

# a tiny SiT on the 8x8 digits: 2x2 patches, a 4x4 token grid, 4 blocks; 128 images, 4 steps an epoch
SIT = ["data.name=digits", "model.img_size=8", "model.patch_size=2", "model.embed_dim=32", "model.depth=4",
       "model.num_heads=2", "data.train_subset=128", "train.batch_size=32", "train.log_every=2", "train.epochs=1",
       "train.warmup_epochs=0", "train.ema_decay=0.9", "train.loggers=[]", "train.aux_proj_dim=16"]


# ----------------------------------------------------------------------------- the references, re-typed
def reference_proj_loss(zs, zs_tilde):  # REPA loss.py, SILoss.__call__'s projection loss
    proj_loss, bsz = 0.0, zs[0].shape[0]
    for z, z_tilde in zip(zs, zs_tilde, strict=True):
        for z_j, z_tilde_j in zip(z, z_tilde, strict=True):
            z_tilde_j = F.normalize(z_tilde_j, dim=-1)
            z_j = F.normalize(z_j, dim=-1)
            proj_loss += torch.mean(-(z_j * z_tilde_j).sum(dim=-1))  # mean_flat of a 1-D tensor: its mean
    return proj_loss / (len(zs) * bsz)


def reference_build_mlp(hidden_size, projector_dim, z_dim):  # REPA models/sit.py
    return nn.Sequential(nn.Linear(hidden_size, projector_dim), nn.SiLU(), nn.Linear(projector_dim, projector_dim),
                         nn.SiLU(), nn.Linear(projector_dim, z_dim))


def reference_disp_loss(z):  # Disperse-Loss transport/transport.py (.cuda() dropped: on the CPU)
    z = z.reshape((z.shape[0], -1))
    diff = F.pdist(z).pow(2) / z.shape[1]
    diff = torch.concat((diff, diff, torch.zeros(z.shape[0])))
    return torch.log(torch.exp(-diff).mean())


def test_repa_loss_equals_repa_proj_loss():
    g = torch.Generator().manual_seed(0)
    projected, target = torch.randn(6, 16, 24, generator=g), torch.randn(6, 16, 24, generator=g)
    ours = repa_loss(projected, target)
    torch.testing.assert_close(ours, reference_proj_loss([target], [projected]), rtol=1e-6, atol=1e-7)
    assert repa_loss(target * 3.0, target).item() == pytest.approx(-1.0)  # aligned tokens: cosine 1


def test_projector_is_repa_build_mlp():
    ours, ref = repa_projector(32, 64, 24), reference_build_mlp(32, 64, 24)
    assert [type(m) for m in ours] == [type(m) for m in ref]
    assert [tuple(p.shape) for p in ours.parameters()] == [tuple(p.shape) for p in ref.parameters()]
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(5, 7, 32)
    assert torch.equal(ours(x), ref(x))
    assert all(torch.equal(m.bias, torch.zeros_like(m.bias)) for m in ours if isinstance(m, nn.Linear))


@pytest.mark.parametrize("spread", [0.1, 1.0, 4.0])
def test_dispersive_loss_equals_disperse_loss_term(spread):
    h = torch.randn(8, 16, 12, generator=torch.Generator().manual_seed(1)) * spread
    torch.testing.assert_close(dispersive_loss(h), reference_disp_loss(h), rtol=1e-5, atol=1e-6)
    # tau scales the distances: tau 2 is the reference on h / sqrt(2)
    torch.testing.assert_close(dispersive_loss(h, tau=2.0), reference_disp_loss(h / 2**0.5), rtol=1e-5, atol=1e-6)
    assert dispersive_loss(torch.ones(4, 3)).item() == pytest.approx(0.0)  # no spread: log mean exp 0


# ----------------------------------------------------------------------------- training with them
@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory):
    """A transformers ViT save_pretrained folder on 8x8 grey digits in 2x2 patches: a 4x4 grid, SiT's."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("vit") / "vit"
    config = transformers.ViTConfig(image_size=8, patch_size=2, num_channels=1, hidden_size=16, num_hidden_layers=2,
                                    num_attention_heads=2, intermediate_size=32)
    torch.manual_seed(0)
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


def _rows(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def _untimed(rows):
    return [{k: v for k, v in r.items() if k not in ("img_per_s", "time_s", "peak_mem_mb", "aux_target_s")} for r in rows]


def test_dispersive_trains_and_logs_both_parts(tmp_path, capsys):
    cfg = load_config("sit-tiny-fmnist", [*SIT, "train.aux=dispersive", "train.aux_tau=0.5",
                                          "train.aux_target=timm:vit_tiny_patch16_224", f"train.out_dir={tmp_path / 'run'}"])
    summary = train(cfg, progress=False)
    assert "train.aux_target* name REPA's frozen encoder, but train.aux=dispersive reads none" in capsys.readouterr().out
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [2, 4]
    for r in rows:  # loss = main + 0.25 * aux (Disperse-Loss's weight), over the same window
        assert r["loss"] == pytest.approx(r["loss_main"] + 0.25 * r["loss_aux"], rel=1e-5)
        assert r["loss_aux"] < 0  # a batch that is not one point: log mean exp(-D) < 0
    assert summary["aux"] == {"kind": "dispersive", "weight": 0.25, "layer": 3, "tau": 0.5}
    aux = ckpt.load_checkpoint(summary["checkpoint"])["aux"]
    assert aux["kind"] == "dispersive" and "projector" not in aux  # nothing trained besides the network


def test_repa_trains_with_a_transformers_folder_and_keeps_the_projector(tmp_path, vit_folder):
    cfg = load_config("sit-tiny-fmnist", [*SIT, "train.aux=repa", f"train.aux_target={vit_folder}",
                                          "train.aux_weight=0.7", f"train.out_dir={tmp_path / 'run'}"])
    target = load_aux_target(cfg)
    assert (target.side, target.grid, target.dim, target.in_chans) == (8, 4, 16, 1)  # its grid is SiT's: no resampling
    summary = train(cfg, progress=False, aux_target=target)
    rows = _rows(tmp_path / "run")
    assert len(rows) == 2 and all(-1 <= r["loss_aux"] <= 1 and r["aux_target_s"] > 0 for r in rows)
    assert all(r["loss"] == pytest.approx(r["loss_main"] + 0.7 * r["loss_aux"], rel=1e-5) for r in rows)
    assert summary["aux"]["layer"] == 0 and summary["aux"]["target_grid"] == 4 and not summary["aux"]["tokens_resampled"]
    assert summary["aux_target_s"] == pytest.approx(sum(r["aux_target_s"] for r in rows))
    state = ckpt.load_checkpoint(summary["checkpoint"])
    assert state["aux"]["projector"]["0.weight"].shape == (16, 32)  # SiT width 32 -> 16 wide
    assert not any(k.startswith(("encoder", "model.")) for k in state["aux"]["projector"])  # the encoder is not saved
    frozen = [p for p in target.encoder.parameters()]
    assert frozen and not any(p.requires_grad for p in frozen)
    trained = sum(p.requires_grad for p in build_model(cfg.model).parameters())
    assert sum(len(g["params"]) for g in state["optimizer"]["param_groups"]) == trained + 6  # + the projector's 6


@pytest.mark.slow
def test_repa_resumes_exactly(tmp_path, vit_folder):
    """8 steps straight vs the same run resumed from its step-3 checkpoint (mid log window, mid epoch): the same
    network, projector, optimizer state and log rows (loss_main and loss_aux included)."""
    def cfg(name):
        return load_config("sit-tiny-fmnist", [*SIT, "train.aux=repa", f"train.aux_target={vit_folder}", "train.epochs=2",
                                               "train.ckpt_every=3", "train.keep_last=5", f"train.out_dir={tmp_path / name}"])

    ref = train(cfg("ref"), progress=False, aux_target=load_aux_target(cfg("ref")))
    shutil.copytree(tmp_path / "ref", tmp_path / "part")
    step3 = ckpt.checkpoint_path(tmp_path / "part" / "checkpoints", 3)
    part = train(cfg("part"), resume=str(step3), progress=False, aux_target=load_aux_target(cfg("part")))
    assert part["resumed_from"] == str(step3)
    a, b = ckpt.load_checkpoint(ref["checkpoint"]), ckpt.load_checkpoint(part["checkpoint"])
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k in a["aux"]["projector"]:
        assert torch.equal(a["aux"]["projector"][k], b["aux"]["projector"][k]), k
    for sa, sb in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True):
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
    assert _untimed(_rows(tmp_path / "ref")) == _untimed(_rows(tmp_path / "part"))
    assert ref["final_loss"] == part["final_loss"]


def test_uvit_aligns_its_patch_tokens_only(tmp_path, vit_folder):
    """U-ViT's sequence is [time, label, patches]: the two prefix tokens are dropped before the projector."""
    uvit = [a.replace("model.depth=4", "model.depth=3") for a in SIT]
    cfg = load_config("uvit-tiny-fmnist", [*uvit, "train.aux=repa", f"train.aux_target={vit_folder}",
                                           f"train.out_dir={tmp_path / 'run'}"])
    summary = train(cfg, progress=False, aux_target=load_aux_target(cfg))
    assert summary["aux"]["layer"] == 0 and summary["aux"]["grid"] == 4
    assert all(-1 <= r["loss_aux"] <= 1 for r in _rows(tmp_path / "run"))


def test_repa_with_a_resdecay_mae_checkpoint(tmp_path, tiny_checkpoints):
    cfg = load_config("sit-tiny-fmnist", [*SIT, "train.aux=repa", f"train.aux_target={tiny_checkpoints['decayed']}",
                                          f"train.out_dir={tmp_path / 'run'}"])
    target = load_aux_target(cfg)
    assert (target.side, target.grid, target.in_chans) == (8, 4, 1)
    tokens = target.tokens(torch.zeros(2, 1, 8, 8))
    assert tokens.shape == (2, 16, target.dim)  # its cls token dropped


def test_a_timm_vit_takes_the_side_of_the_model_grid(tmp_path):
    """Built for 16 px in 2-px patches (8x8 tokens), it is fed 8 px: its position table resampled to SiT's 4x4,
    as REPA resamples DINOv2's; the frozen encoder's tokens are then SiT's grid, token for token."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=2, depth=1, embed_dim=32,
                            num_heads=2, in_chans=1, num_classes=0)
    torch.save(vit.state_dict(), tmp_path / "vit.pth")
    args = "{img_size: 16, patch_size: 2, depth: 1, embed_dim: 32, num_heads: 2, in_chans: 1}"
    cfg = load_config("sit-tiny-fmnist", [*SIT, "train.aux=repa", "train.aux_target=timm:vit_tiny_patch16_224",
                                          f"train.aux_target_weights={tmp_path / 'vit.pth'}", f"train.aux_target_args={args}"])
    target = load_aux_target(cfg)
    assert (target.side, target.grid, target.dim, target.in_chans) == (8, 4, 32, 1)
    assert target.tokens(torch.zeros(3, 1, 8, 8)).shape == (3, 16, 32)  # the cls token dropped
    assert target.mean == (0.5,) and target.std == (0.5,)  # timm's pretrained_cfg stats, averaged to its one channel


def test_a_timm_target_without_weights_is_refused_unless_random_is_asked_for(tmp_path, capsys, vit_folder):
    """A timm / torchvision name is built with random weights, and REPA to it would align to noise: a forgotten
    weights file is one line, nothing written; ``random`` asks for it (named in the header and the summary). A
    folder holds its own weights: ``random`` is refused for it."""
    args = "{img_size: 16, patch_size: 2, depth: 1, embed_dim: 32, num_heads: 2, in_chans: 1}"
    by_name = ["train.aux=repa", "train.aux_target=timm:vit_tiny_patch16_224", f"train.aux_target_args={args}"]
    out = tmp_path / "run"
    code, _, err = run(capsys, "pretrain", "--preset", "sit-tiny-fmnist", "--no-progress", *SIT, *by_name,
                       f"train.out_dir={out}")
    assert_one_line_error(code, err, "train.aux_target=timm:vit_tiny_patch16_224", "no weights", "randomly initialised",
                          "train.aux_target_weights=random")
    assert not out.exists()
    code, printed, err = run(capsys, "pretrain", "--preset", "sit-tiny-fmnist", "--no-progress", *SIT, *by_name,
                             "train.aux_target_weights=random", f"train.out_dir={out}")
    assert code == 0, err
    assert "target timm:vit_tiny_patch16_224, random weights (seed 0) at 8 px" in printed
    assert json.loads((out / "summary.json").read_text())["aux"]["target_weights"] == "random"
    folder = tmp_path / "folder"
    code, _, err = run(capsys, "pretrain", "--preset", "sit-tiny-fmnist", "--no-progress", *SIT, "train.aux=repa",
                       f"train.aux_target={vit_folder}", "train.aux_target_weights=random", f"train.out_dir={folder}")
    assert_one_line_error(code, err, "train.aux_target_weights=random", "holds its own weights")
    assert not folder.exists()


def test_an_encoder_with_a_finer_fixed_grid_has_its_tokens_resampled(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=16, patch_size=2, num_channels=1, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=32)
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(tmp_path / "fine")
    cfg = load_config("sit-tiny-fmnist", [*SIT, "train.aux=repa", f"train.aux_target={tmp_path / 'fine'}",
                                          f"train.out_dir={tmp_path / 'run'}"])
    target = load_aux_target(cfg)
    assert (target.side, target.grid) == (16, 8)  # a transformers ViT takes its own side only
    summary = train(cfg, progress=False, aux_target=target)
    assert summary["aux"]["tokens_resampled"] and summary["aux"]["target_grid"] == 8 and summary["aux"]["grid"] == 4
    assert all(-1 <= r["loss_aux"] <= 1 for r in _rows(tmp_path / "run"))


# ----------------------------------------------------------------------------- bad input: one line, nothing written
@pytest.fixture
def coarse_vit(tmp_path):
    """A transformers ViT whose 2x2 tokens are coarser than SiT's 4x4 and which takes no other side."""
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=32)
    transformers.ViTModel(config, add_pooling_layer=False).save_pretrained(tmp_path / "coarse")
    return tmp_path / "coarse"


@pytest.mark.parametrize("extra,fragments", [
    (["train.aux=repa"], ["train.aux=repa", "train.aux_target=timm:NAME"]),
    (["train.aux=repa", "train.aux_target=nosuch:thing"], ["train.aux_target=nosuch:thing"]),
    (["train.aux=dispersive", "train.aux_layer=4"], ["train.aux_layer=4", "0..3"]),
    (["train.aux=dispersive", "train.aux_weight=-1"], ["train.aux_weight", ">= 0"]),
    (["train.aux=dispersive", "train.aux_tau=0"], ["train.aux_tau", "> 0"]),
    (["train.aux=repa", "train.aux_target=timm:vit_tiny_patch16_224", "train.aux_proj_dim=0"], ["train.aux_proj_dim"]),
    (["train.aux=reap"], ["train.aux", "repa"]),
    (["train.aux=dispersive", "model.hyper_streams=2"], ["model.hyper_streams=2", "set model.hyper_streams=1"]),
])
def test_bad_aux_settings_are_one_line(capsys, tmp_path, extra, fragments):
    out = tmp_path / "run"
    code, _, err = run(capsys, "pretrain", "--preset", "sit-tiny-fmnist", "--no-progress", *SIT, *extra,
                       f"train.out_dir={out}")
    assert_one_line_error(code, err, *fragments)
    assert not out.exists()


def test_aux_on_a_family_without_diffusion_states_is_one_line(capsys, tmp_path):
    out = tmp_path / "run"
    code, _, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", "train.aux=dispersive",
                       f"train.out_dir={out}")
    assert_one_line_error(code, err, "no diffusion hidden states to align", "'mae'")
    assert not out.exists()


def test_a_target_grid_that_cannot_be_matched_is_one_line(capsys, tmp_path, coarse_vit):
    out = tmp_path / "run"
    code, _, err = run(capsys, "pretrain", "--preset", "sit-tiny-fmnist", "--no-progress", *SIT, "train.aux=repa",
                       f"train.aux_target={coarse_vit}", f"train.out_dir={out}")
    assert_one_line_error(code, err, "2x2", "4x4", "cannot be matched")
    assert not out.exists()


def test_the_python_api_without_the_built_target_is_one_line(tmp_path):
    from resdecay.errors import ConfigError

    cfg = load_config("sit-tiny-fmnist", [*SIT, "train.aux=repa", "train.aux_target=timm:vit_tiny_patch16_224",
                                          f"train.out_dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match="load_aux_target"):
        train(cfg, progress=False)
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- torchrun
DRIVER = '''
import os, pathlib, sys, torch
from resdecay.cli import main
from resdecay.train.aux_objective import AuxObjective

record, remove = pathlib.Path(sys.argv[1]), AuxObjective.remove

def keep(self):  # every rank's projector as the run ends
    torch.save(self.projector.state_dict(), record / f"projector{os.environ['RANK']}.pt")
    remove(self)

AuxObjective.remove = keep
sys.exit(main(sys.argv[2:]))
'''


@pytest.mark.slow
def test_torchrun_ranks_share_one_projector(tmp_path, vit_folder):
    """DDP wraps the network only: the projector is broadcast from rank 0 and its gradients averaged, so both
    ranks end with the same projector (the one the checkpoint holds), and the logged parts are global means."""
    import os
    import subprocess
    import sys

    from helpers import free_port

    (tmp_path / "driver.py").write_text(DRIVER)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(tmp_path / "driver.py"), str(tmp_path), "pretrain", "--preset", "sit-tiny-fmnist", "--no-progress", *SIT,
           "train.batch_size=16", "train.threads=1", "train.aux=repa", f"train.aux_target={vit_folder}",
           f"train.out_dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    p0, p1 = (torch.load(tmp_path / f"projector{r}.pt") for r in (0, 1))
    saved = ckpt.load_checkpoint(ckpt.list_checkpoints(out / "checkpoints")[-1])["aux"]["projector"]
    assert all(torch.equal(p0[k], p1[k]) and torch.equal(p0[k], saved[k]) for k in p0)
    assert all("loss_aux" in r for r in _rows(out)) and len(saved) == 6
