import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import THREADS, TINY, copy_run, run
from resdecay.errors import CheckpointError, TrainingDiverged
from resdecay.models import FAMILIES, Family
from resdecay.train import checkpoint as ckpt
from resdecay.train import lr_at, param_groups, train
from resdecay.train.config import load_config


def test_lr_schedule_warmup_then_cosine_to_floor():
    assert lr_at(0, 100, 10, 1.0, 0.0) == 0.0
    assert lr_at(5, 100, 10, 1.0, 0.0) == pytest.approx(0.5)
    assert lr_at(10, 100, 10, 1.0, 0.0) == pytest.approx(1.0)
    assert lr_at(55, 100, 10, 1.0, 0.1) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_at(100, 100, 10, 1.0, 0.1) == pytest.approx(0.1)


def test_no_weight_decay_on_biases_and_1d_params():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    decay, no_decay = param_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and [p.shape for p in decay["params"]] == [(4, 4)]
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 3


@pytest.mark.slow
def test_tiny_run_learns_and_writes_everything(tmp_path, tiny_overrides):
    # 512 training digits, 8 steps an epoch (not 22): 48 steps still lower the loss; checkpoints every 10, the last 2 kept
    cfg = load_config("mae-tiny-digits", [*tiny_overrides, "train.epochs=6", "train.ckpt_every=10", "train.keep_last=2",
                                          "data.train_subset=512"])
    summary = train(cfg, progress=False)
    out = tmp_path / "run"
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == summary["steps"] == 6 * 8
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert {"loss", "lr", "img_per_s", "peak_mem_mb", "epoch"} <= set(rows[0])
    assert any(p.name.startswith("events.out.tfevents") for p in (out / "tb").iterdir())
    kept = ckpt.list_checkpoints(out / "checkpoints")
    assert [p.name for p in kept] == ["step_00000040.pt", "step_00000048.pt"]  # keep-last-2
    state = ckpt.load_checkpoint(kept[-1])
    assert state["config"]["model"]["alpha_min"] == 0.6 and state["config"]["model"]["schedule"] == "linear"
    assert {"model", "optimizer", "scaler", "train_state", "rng", "config"} <= set(state)
    model, cfg2 = ckpt.load_model(kept[-1])
    assert model.blocks[-1].alpha_mlp == 0.6 and cfg2.model.alpha_min == 0.6  # rebuilt from the stored config


def _cli(args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(THREADS)}
    return subprocess.Popen([sys.executable, "-m", "resdecay", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, **kw)


@pytest.mark.slow
def test_sigkill_then_resume_auto_equals_uninterrupted_run(tmp_path, capsys):
    # 4 epochs of 512 training digits (8 steps each, 32 in all, not 22 and 88): the kill lands in the second epoch (the
    # first checkpoint is step 10), 22 steps before the end, and the resumed run crosses two epoch boundaries of the
    # augmentation's and the schedule's state; bit-identical weights and a log without duplicates need no more steps
    common = ["pretrain", "--preset", "mae-tiny-digits", "--no-progress", *TINY, "train.epochs=4", "train.ckpt_every=10",
              f"train.threads={THREADS}", "data.augment=mae", "data.train_subset=512"]
    # 1. uninterrupted, the reference: the same command in this process (the killed and resumed runs are the processes
    #    under test; train.threads gives the reference their threads, so their bits)
    code, _, err = run(capsys, *common, f"train.out_dir={tmp_path / 'ref'}")
    assert code == 0, err
    # 2. killed with SIGKILL as soon as a checkpoint is on disk, then resumed
    run_dir = tmp_path / "killed"
    proc = _cli([*common, f"train.out_dir={run_dir}"])
    deadline = time.time() + 120
    while not ckpt.list_checkpoints(run_dir / "checkpoints") and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    killed_at = ckpt.list_checkpoints(run_dir / "checkpoints")[-1]
    resumed = _cli([*common, f"train.out_dir={run_dir}", "--resume", "auto"])
    out = resumed.stdout.read()
    assert resumed.wait(timeout=300) == 0, out
    assert f"resumed from {killed_at}" in out
    a = ckpt.load_checkpoint(ckpt.list_checkpoints(tmp_path / "ref" / "checkpoints")[-1])
    b = ckpt.load_checkpoint(ckpt.list_checkpoints(run_dir / "checkpoints")[-1])
    assert a["train_state"]["step"] == b["train_state"]["step"] == 4 * 8
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    steps = [json.loads(line)["step"] for line in (run_dir / "log.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # the log continues without duplicates


def test_resume_from_a_different_model_is_refused(tmp_path, tiny_overrides, tiny_checkpoints):
    copy_run(tiny_checkpoints["decayed"], tmp_path / "run")  # a run of this config lies in train.out_dir
    for change, field in (("alpha_min=0.8", "model.alpha_min"), ("model.depth=6", "model.depth")):
        with pytest.raises(CheckpointError, match=f"different model .*{field}: checkpoint"):
            train(load_config("mae-tiny-digits", [*tiny_overrides, "train.epochs=2", change]), resume="auto", progress=False)


@pytest.mark.slow
def test_resume_auto_without_checkpoint_starts_fresh(tmp_path, tiny_overrides, capsys):
    train(load_config("mae-tiny-digits", [*tiny_overrides, "train.epochs=1", "data.train_subset=256"]), resume="auto",
          progress=False)
    assert "starting fresh" in capsys.readouterr().out


@pytest.mark.slow
def test_non_finite_loss_stops_cleanly_and_keeps_last_good_checkpoint(tmp_path, tiny_overrides, monkeypatch):
    calls = {"n": 0}

    def exploding(model, images, labels):
        calls["n"] += 1
        loss = model(images)[0]
        return loss * math.nan if calls["n"] > 30 else loss

    monkeypatch.setitem(FAMILIES, "mae", Family(FAMILIES["mae"].config, FAMILIES["mae"].build, exploding))
    cfg = load_config("mae-tiny-digits", [*tiny_overrides, "train.ckpt_every=10", "train.log_every=7"])
    with pytest.raises(TrainingDiverged, match=r"non-finite by step 35; the last good checkpoint .*step_00000030.pt is kept.*alpha_min"):
        train(cfg, progress=False)
    kept = ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")
    assert kept[-1].name == "step_00000030.pt"
    state = ckpt.load_checkpoint(kept[-1])
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_not_a_checkpoint(tmp_path):
    bad = tmp_path / "x.pt"
    torch.save({"weights": torch.zeros(2)}, bad)
    with pytest.raises(CheckpointError, match="not a resdecay checkpoint"):
        ckpt.load_checkpoint(bad)
    (tmp_path / "y.pt").write_text("garbage")
    with pytest.raises(CheckpointError, match="not a readable resdecay checkpoint"):
        ckpt.load_checkpoint(tmp_path / "y.pt")


def test_atomic_save_leaves_no_partial_file(tmp_path, monkeypatch):
    ckpt.save_checkpoint({"a": torch.zeros(3)}, tmp_path, 1, keep_last=3)

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError):
        ckpt.save_checkpoint({"a": torch.ones(3)}, tmp_path, 2, keep_last=3)
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000001.pt"]


@pytest.mark.slow
def test_gradient_accumulation_matches_the_big_batch(tmp_path):
    """2 micro-batches of 32 with accumulation == one batch of 64 (same samples, same masks), over 256 training digits
    (4 optimizer steps)."""
    finals = []
    for bs, accum in ((64, 1), (32, 2)):
        cfg = load_config("mae-tiny-digits", [*TINY, "train.epochs=1", f"train.batch_size={bs}", f"train.accum_steps={accum}",
                                              "model.zero_init=false", "data.train_subset=256", f"train.out_dir={tmp_path / str(bs)}"])
        summary = train(cfg, progress=False)
        finals.append(ckpt.load_checkpoint(summary["checkpoint"])["model"])
    for k in finals[0]:
        a, b = finals[0][k], finals[1][k]
        if k.endswith("attn.qkv.bias"):
            # softmax ignores the key bias, so its true gradient is 0 and Adam turns rounding
            # noise (which differs between the two summation orders) into lr-sized steps
            d = a.shape[0] // 3
            a, b = torch.cat([a[:d], a[2 * d:]]), torch.cat([b[:d], b[2 * d:]])
        assert torch.allclose(a, b, atol=1e-6), k


def test_epoch_hook_does_not_shift_the_training_rng(tmp_path, tiny_checkpoints):
    """Online evaluation runs at epoch ends; it must not change training: the run with a hook that draws random
    numbers ends with the weights of the same run without one (the session's tiny decayed run)."""
    calls = []
    cfg = load_config("mae-tiny-digits", [*TINY, f"train.out_dir={tmp_path / 'hooked'}"])
    hooked = ckpt.load_checkpoint(train(cfg, progress=False, hooks=[
        lambda model, epoch, step, log: calls.append(torch.rand(1000).sum())])["checkpoint"])
    plain = ckpt.load_checkpoint(tiny_checkpoints["decayed"])
    same_run = [{**state["config"], "train": {**state["config"]["train"], "out_dir": None}} for state in (plain, hooked)]
    assert same_run[0] == same_run[1]  # the shared run is this run but for its folder
    assert len(calls) == 2
    assert all(torch.equal(plain["model"][k], hooked["model"][k]) for k in plain["model"])


@pytest.mark.slow
def test_a_run_killed_in_its_epoch_hook_runs_the_hook_again_on_resume(tmp_path):
    """The epoch's last checkpoint is written after its hook (online eval): a run that dies inside the
    hook resumes from the checkpoint before, so no epoch loses its evaluation row for good, and the
    weights still equal an uninterrupted run's."""
    # 256 training digits, 4 steps an epoch (not 22): checkpoints at steps 3 and 6 inside the epochs, the epoch ends at 4 and 8
    common = [*TINY, "train.epochs=3", "train.ckpt_every=3", "data.train_subset=256", f"train.out_dir={tmp_path / 'run'}"]
    seen = []

    def dies_at_epoch_1(model, epoch, step, log):
        if epoch == 1:
            raise KeyboardInterrupt  # killed while evaluating
        seen.append(epoch)

    with pytest.raises(KeyboardInterrupt):
        train(load_config("mae-tiny-digits", common), progress=False, hooks=[dies_at_epoch_1])
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")][-1] == "step_00000006.pt"
    summary = train(load_config("mae-tiny-digits", common), resume="auto", progress=False,
                    hooks=[lambda model, epoch, step, log: seen.append(epoch)])
    assert seen == [0, 1, 2]
    ref = train(load_config("mae-tiny-digits", [*common[:-1], f"train.out_dir={tmp_path / 'ref'}"]), progress=False)
    a, b = (ckpt.load_checkpoint(s["checkpoint"])["model"] for s in (ref, summary))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_ema_and_constant_lr_resume_exactly(tmp_path, tiny_overrides):
    """EMA weights live in the checkpoint and continue exactly after a resume; constant lr stays at peak."""
    from resdecay.train import lr_at

    assert lr_at(5, 100, 10, 1e-3, 0.0, "constant") == pytest.approx(5e-4)
    assert lr_at(90, 100, 10, 1e-3, 0.0, "constant") == 1e-3
    # 256 training digits, 4 steps an epoch: the resume still starts from the first epoch's last checkpoint
    ema = ["train.ema_decay=0.9", "train.lr_schedule=constant", "train.ckpt_every=11", "train.keep_last=10",
           "data.train_subset=256"]
    ref = load_config("mae-tiny-digits", [*tiny_overrides, *ema, f"train.out_dir={tmp_path / 'ref'}"])
    train(ref, progress=False)
    part = load_config("mae-tiny-digits", [*tiny_overrides, *ema, "train.epochs=1", f"train.out_dir={tmp_path / 'part'}"])
    train(part, progress=False)
    full = load_config("mae-tiny-digits", [*tiny_overrides, *ema, f"train.out_dir={tmp_path / 'part'}"])
    train(full, resume="auto", progress=False)
    a = ckpt.load_checkpoint(ckpt.list_checkpoints(tmp_path / "ref" / "checkpoints")[-1])
    b = ckpt.load_checkpoint(ckpt.list_checkpoints(tmp_path / "part" / "checkpoints")[-1])
    assert "ema" in a and a["train_state"]["step"] == b["train_state"]["step"]
    for k in a["ema"]:
        assert torch.equal(a["ema"][k], b["ema"][k]), k
    # the EMA lags the weights: it differs from them but is close
    w = a["model"]["decoder_pred.weight"]
    assert not torch.equal(a["ema"]["decoder_pred.weight"], w)
    model, _ = ckpt.load_model(ckpt.list_checkpoints(tmp_path / "ref" / "checkpoints")[-1], ema=True)
    assert torch.equal(model.state_dict()["decoder_pred.weight"], a["ema"]["decoder_pred.weight"])
