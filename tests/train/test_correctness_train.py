"""Issue 23, the training path: resuming a finished run (23.4), TensorBoard after a resume (23.5),
logs under torchrun (23.6), paths that failed or misled (23.13) and bad input that ended in a
traceback (23.12). Every test here fails on the code before the fix."""

from __future__ import annotations

import dataclasses
import errno
import json
import time

import pytest
import torch

from helpers import TINY, assert_one_line_error, run
from resdecay.io import NoSpaceLeft, is_disk_full
from resdecay.models import FAMILIES
from resdecay.train import checkpoint as ckpt
from resdecay.train import loop, train
from resdecay.train.config import load_config
from resdecay.train.log.runlog import read_log

QUICK = [*TINY, "train.epochs=1", "data.train_subset=256", "train.threads=1"]  # 4 steps of 64


def strict_json(path) -> dict:
    """Parse as JSON proper: NaN / Infinity (Python's extension) fail."""
    def refuse(constant):
        raise ValueError(f"{path} holds {constant}, which is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def snapshot(folder) -> dict:
    """Every file of a run folder (but the lock) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "run.lock"}


def pretrain(out, *extra):
    return ["pretrain", "--preset", "mae-tiny-digits", "--no-progress", *QUICK, f"train.out_dir={out}", *extra]


# ----------------------------------------------------------------------------- 23.4
def test_resuming_a_finished_run_changes_nothing_and_more_epochs_extend_it(capsys, tmp_path):
    """Issue 23.4: resuming a finished run wrote "final_loss": NaN and a train time of 0.001 s."""
    out = tmp_path / "run"
    code, _, err = run(capsys, *pretrain(out))
    assert code == 0, err
    first = strict_json(out / "summary.json")
    before = snapshot(out)
    code, text, err = run(capsys, *pretrain(out, "--resume", "auto"))
    assert code == 0, err
    assert f"{out} is already finished: 4 steps" in text and "raise train.epochs" in text and "done:" not in text
    assert snapshot(out) == before  # summary, log, checkpoints and TensorBoard events untouched
    # a summary lost (or written with NaN by an older version) is rebuilt from the checkpoint
    (out / "summary.json").write_text(json.dumps({**first, "final_loss": float("nan")}))
    assert run(capsys, *pretrain(out, "--resume", "auto"))[0] == 0
    rebuilt = strict_json(out / "summary.json")
    assert rebuilt["final_loss"] == first["final_loss"] == read_log(out)[-1]["loss"]
    assert rebuilt["steps"] == 4 and rebuilt["train_time_s"] > 0.01
    # raising train.epochs extends the run; its time is summed over both launches
    code, text, err = run(capsys, *pretrain(out, "train.epochs=2", "--resume", "auto"))
    assert code == 0 and "done: 8 steps" in text, err
    second = strict_json(out / "summary.json")
    assert second["steps"] == 8 and second["final_loss"] == read_log(out)[-1]["loss"]


class FakeClock:
    """``time`` for the loop whose perf_counter advances ``tick`` seconds per call."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


def test_training_time_is_summed_over_launches(tmp_path, monkeypatch):
    """Issue 23.13: summary.json's train_time_s counted only the last launch."""
    out = [*QUICK, f"train.out_dir={tmp_path / 'run'}"]
    monkeypatch.setattr(loop, "time", FakeClock(100.0))  # a slow first launch
    first = train(load_config("mae-tiny-digits", out), progress=False)["train_time_s"]
    assert first >= 100
    monkeypatch.setattr(loop, "time", FakeClock(0.001))  # a fast second one
    second = train(load_config("mae-tiny-digits", [*out, "train.epochs=2"]), resume="auto", progress=False)["train_time_s"]
    # the first launch's time (as of its last checkpoint, a few clock reads before its end) plus the second's
    assert 100 <= second < first + 1


# ----------------------------------------------------------------------------- 23.5
def test_tensorboard_keeps_the_resumed_from_step(tmp_path):
    """Issue 23.5: purge_step removed the resumed-from step from TensorBoard while log.jsonl kept it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    cfg = [*TINY, "train.epochs=1", "data.train_subset=640", "train.threads=1", "train.log_every=2",
           "train.ckpt_every=4", "train.keep_last=10", f"train.out_dir={out}"]
    train(load_config("mae-tiny-digits", cfg), progress=False)  # 10 steps; as if killed after step 4's checkpoint
    train(load_config("mae-tiny-digits", cfg), resume=str(ckpt.checkpoint_path(out / "checkpoints", 4)), progress=False)
    rows = read_log(out)
    events = EventAccumulator(str(out / "tb"))
    events.Reload()
    scalars = events.Scalars("train/loss")
    assert [e.step for e in scalars] == [r["step"] for r in rows] == [2, 4, 6, 8, 10]
    assert [e.value for e in scalars] == pytest.approx([r["loss"] for r in rows], rel=1e-6)


def test_an_event_file_opened_in_the_same_second_sorts_after_the_last_one(tmp_path):
    """The test above failed once in a full suite run: its two launches fell in one second of one process, their
    files' counters were 99 and 100, the resumed launch's file sorted (and was replayed) first and its purge purged
    nothing. A file there of this second that sorts after any other (host zzzz) stands for the killed launch's."""
    from resdecay.train.log.trackers import TensorBoardTracker

    tb = tmp_path / "run" / "tb"
    tb.mkdir(parents=True)
    killed = tb / f"events.out.tfevents.{int(time.time())}.zzzz.99999.999"
    killed.write_bytes(b"")
    tracker = TensorBoardTracker()
    tracker.start(None, tmp_path / "run", resume_step=4)
    tracker.finish()
    names = sorted(p.name for p in tb.iterdir())
    assert len(names) == 2 and names[0] == killed.name


# ----------------------------------------------------------------------------- 23.6
# The torchrun checks (logged loss the global mean, rank 0 alone reports) are in test_torchrun.py.


# ----------------------------------------------------------------------------- 23.13
def test_final_loss_and_log_rows_do_not_depend_on_ckpt_every_or_a_resume(tmp_path):
    """Issue 23.13: log rows (and so the final loss) came at checkpoints too, so two bit-identical
    runs with different ckpt_every printed different final losses."""
    def go(name, ckpt_every, resume=None):
        cfg = [*QUICK, f"train.ckpt_every={ckpt_every}", "train.keep_last=10", f"train.out_dir={tmp_path / name}"]
        return train(load_config("mae-tiny-digits", cfg), resume=resume, progress=False)

    a, b = go("a", 3), go("b", 100)
    wa, wb = (ckpt.load_checkpoint(s["checkpoint"])["model"] for s in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # the same training
    untimed = [[{k: v for k, v in r.items() if k not in ("img_per_s", "time_s", "peak_mem_mb")} for r in read_log(tmp_path / n)]
               for n in ("a", "b")]
    assert untimed[0] == untimed[1] and [r["step"] for r in untimed[0]] == [4]  # log_every=5: the last step only
    assert a["final_loss"] == b["final_loss"]
    c = go("c", 3, resume=str(ckpt.checkpoint_path(tmp_path / "a" / "checkpoints", 3)))  # continues step 3's open window
    assert c["final_loss"] == a["final_loss"]


def test_resume_auto_falls_back_from_a_truncated_checkpoint(capsys, tmp_path):
    """Issue 23.13: --resume auto stopped at a truncated newest checkpoint instead of using the previous one."""
    out = tmp_path / "run"
    args = pretrain(out, "train.ckpt_every=2", "train.keep_last=5")
    assert run(capsys, *args)[0] == 0
    newest = ckpt.checkpoint_path(out / "checkpoints", 4)
    newest.write_bytes(newest.read_bytes()[:1000])  # a crash of the machine or a full disk mid-copy
    code, text, err = run(capsys, *args, "--resume", "auto")
    assert code == 0, err
    assert (f"warning: --resume auto skipped {newest.name}: {newest} is not a readable resdecay checkpoint (it is truncated"
            in text and f"resuming from the previous complete checkpoint {out / 'checkpoints' / 'step_00000002.pt'}" in text)
    assert ckpt.load_checkpoint(newest)["train_state"]["step"] == 4  # rewritten whole
    for p in ckpt.list_checkpoints(out / "checkpoints"):
        p.write_bytes(b"")
    code, _, err = run(capsys, *args, "--resume", "auto")
    assert_one_line_error(code, err, "--resume auto: no checkpoint in", "can be read", "--overwrite")


def test_a_failed_start_leaves_nothing_behind(capsys, tmp_path, monkeypatch):
    """Issue 23.13: a start that failed at its first step left run.lock and tb/ behind."""
    from resdecay.errors import DataError

    def failing(model, images, labels):
        raise DataError("cannot read image x.png (simulated)")

    monkeypatch.setitem(FAMILIES, "mae", dataclasses.replace(FAMILIES["mae"], objective=failing))
    made = tmp_path / "made"
    assert_one_line_error(*run(capsys, *pretrain(made))[::2], "simulated")
    assert not made.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert_one_line_error(*run(capsys, *pretrain(mine))[::2], "simulated")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_a_batch_larger_than_most_of_a_small_data_set_warns(capsys, tmp_path):
    """Issue 23.13: 100 images in batches of 64 silently dropped 36 of them every epoch."""
    code, text, err = run(capsys, *pretrain(tmp_path / "run", "data.train_subset=100"))
    assert code == 0, err
    warning = [ln for ln in text.splitlines() if ln.startswith("warning: an effective batch of 64")]
    assert len(warning) == 1 and "36 (36%) are left out of every epoch" in warning[0], text
    assert "lower train.batch_size to 50 or less" in warning[0]


# ----------------------------------------------------------------------------- 23.12
@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 4224 vs 4160")])
def test_a_full_disk_while_checkpointing_is_one_line_and_keeps_the_last_good_checkpoint(capsys, tmp_path, monkeypatch, failure):
    """Issue 23.12: a full disk while writing a checkpoint ended in a traceback."""
    real_save, calls = torch.save, []

    def filling_disk(obj, f):
        calls.append(1)
        if len(calls) == 2:
            f.write(b"partial")
            raise failure
        return real_save(obj, f)

    monkeypatch.setattr(torch, "save", filling_disk)
    out = tmp_path / "run"
    code, _, err = run(capsys, *pretrain(out, "train.ckpt_every=2"))
    good = ckpt.checkpoint_path(out / "checkpoints", 2)
    assert_one_line_error(code, err, f"no space left on the device while writing {out / 'checkpoints' / 'step_00000004.pt'}",
                          "it needs about", "free there", f"the last good checkpoint {good} is kept", "--resume auto")
    assert [p.name for p in (out / "checkpoints").iterdir()] == [good.name]  # no partial file
    assert ckpt.load_checkpoint(good)["train_state"]["step"] == 2


def test_disk_full_is_recognised_through_wrapping_errors():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("PytorchStreamWriter failed") from e
    except RuntimeError as e:
        assert is_disk_full(e)
    assert not is_disk_full(RuntimeError("something else")) and not is_disk_full(OSError(errno.EACCES, "denied"))
    assert isinstance(NoSpaceLeft("x"), OSError)  # code that tolerates a failed cache write still catches it


@pytest.mark.parametrize("extra,fragments", [
    (["train.lr=.nan"], ["train.lr must be a finite number, got nan"]),
    (["train.lr=.inf"], ["train.lr must be a finite number, got inf"]),
    (["train.threads=-1"], ["train.threads must be a positive integer", "got -1"]),
    (["train.threads=0"], ["train.threads must be a positive integer", "got 0"]),
    (["--overwrite", "--resume", "auto"], ["--overwrite starts the run over but --resume auto continues it"]),
])
def test_bad_training_settings_are_one_line(capsys, tmp_path, extra, fragments):
    """Issue 23.12: NaN / inf learning rates and thread counts below 1 were accepted; --overwrite
    with --resume auto resumed and wrote NaN."""
    assert_one_line_error(*run(capsys, *pretrain(tmp_path / "run", *extra))[::2], *fragments)
    assert not (tmp_path / "run").exists()


def test_a_model_that_cannot_fit_is_refused_before_it_is_built(capsys, tmp_path, monkeypatch):
    """Issue 23.12: model.depth=100000 allocated for minutes until killed."""
    from resdecay.train.run import capacity

    monkeypatch.setattr(capacity, "available_memory", lambda device: (8 << 30, "available RAM"))
    started = time.perf_counter()
    code, _, err = run(capsys, *pretrain(tmp_path / "run", "model.depth=100000"))
    assert_one_line_error(code, err, "the model would have", "M parameters", "model.depth=100000", "8.0 GiB of available RAM",
                          "lower model.depth")
    assert time.perf_counter() - started < 60 and not (tmp_path / "run").exists()


def test_the_parameter_estimate_is_exact_where_it_extrapolates():
    from resdecay.models import build_model
    from resdecay.models.common import count_parameters

    for preset, changes in (("mae-tiny-digits", {"depth": 41}), ("mae-tiny-digits", {"decoder_depth": 40}),
                            ("uvit-tiny-fmnist", {"depth": 41}), ("sit-tiny-fmnist", {"depth": 40})):
        cfg = dataclasses.replace(load_config(preset).model, **changes)
        with torch.device("meta"):
            real = sum(p.numel() for p in build_model(cfg).parameters())
        assert count_parameters(cfg, build_model) == real, (preset, changes)
