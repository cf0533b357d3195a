"""Issue 15: what real data sets and real machines do to a run (bad files, kills mid-write,
damaged caches, two runs in one folder, misleading messages, settings that do nothing)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from helpers import THREADS, TINY, assert_one_line_error, run
from resdecay.io import sweep_stale_temps
from resdecay.train import train
from resdecay.train.config import load_config
from resdecay.train.run import runlock

SMALL = [*TINY, "train.epochs=1", "data.train_subset=256", f"train.threads={THREADS}"]  # 4 steps


def _python(code: str, *args) -> subprocess.Popen:
    """A helper process that prints one line when it is ready, then waits to be killed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


# ----------------------------------------------------------------------------- 4. one run per folder
HOLD_LOCK = ("import sys, time\nfrom resdecay.train.run import runlock\nrunlock.acquire(sys.argv[1])\n"
             "print('locked', flush=True)\ntime.sleep(120)")


@pytest.mark.slow
def test_second_run_in_a_busy_folder_is_refused_and_a_killed_holder_leaves_no_stale_lock(capsys, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    holder = _python(HOLD_LOCK, run_dir)
    try:
        assert holder.stdout.readline().strip() == "locked"
        argv = ["pretrain", "--preset", "mae-tiny-digits", "--no-progress", *SMALL, f"train.out_dir={run_dir}", "--resume", "auto"]
        code, _, err = run(capsys, *argv)
        assert_one_line_error(code, err, f"run folder {run_dir} is in use by process {holder.pid}", "train.out_dir=")
        assert not (run_dir / "log.jsonl").exists()  # refused before touching anything
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    code, out, err = run(capsys, *argv)  # the OS dropped the killed holder's lock
    assert code == 0, err
    code, out, err = run(capsys, *argv)  # and a run that returned released its own: same process, same folder
    assert code == 0 and "is already finished" in out, err  # a finished run is left as it is (issue 23.4)
    assert not (run_dir / runlock.LOCK_NAME).exists()  # issue 38.7: a released lock leaves no run.lock behind


def test_nested_lock_in_one_process_is_reentrant(tmp_path):
    with runlock.run_lock(tmp_path):
        with runlock.run_lock(tmp_path):
            pass
        assert str(tmp_path.resolve()) in runlock._held  # still held by the outer block
    assert str(tmp_path.resolve()) not in runlock._held


# ----------------------------------------------------------------------------- 2. no debris after a kill mid-write
KILLED_WRITER = ("import sys, time, torch\nfrom resdecay.io import atomic_save\n"
                 "def slow(obj, f):\n    f.write(b'x' * 4096); f.flush(); print('writing', flush=True); time.sleep(120)\n"
                 "torch.save = slow\natomic_save({}, sys.argv[1])")


@pytest.mark.slow
def test_temp_files_of_writers_killed_mid_checkpoint_are_swept_on_resume(capsys, tmp_path):
    ckpt_dir = tmp_path / "run" / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    writer = _python(KILLED_WRITER, ckpt_dir / "step_00000004.pt")
    assert writer.stdout.readline().strip() == "writing"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    debris = list(ckpt_dir.glob(".step_00000004.pt.tmp-*"))
    assert len(debris) == 1  # what SIGKILL during a write leaves behind
    code, out, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *SMALL,
                         f"train.out_dir={tmp_path / 'run'}", "--resume", "auto")
    assert code == 0, err
    assert "removed 1 partial checkpoint file" in out
    assert not list(ckpt_dir.glob(".*tmp-*")) and [p.name for p in ckpt_dir.iterdir()] == ["step_00000004.pt"]


def test_sweep_keeps_temp_files_of_live_writers_unless_the_folder_is_owned(tmp_path):
    live = _python("print('up', flush=True); import time; time.sleep(120)")
    try:
        assert live.stdout.readline().strip() == "up"
        mine, theirs = tmp_path / f".a.pt.tmp-{os.getpid()}", tmp_path / f".b.pt.tmp-{live.pid}"
        for p in (mine, theirs):
            p.write_bytes(b"x")
        (tmp_path / "c.pt").write_bytes(b"x")
        assert sweep_stale_temps(tmp_path) == [] and theirs.exists()  # its writer is alive
        assert sweep_stale_temps(tmp_path, owned=True) == [theirs]  # under the run lock nobody else writes
        assert mine.exists() and (tmp_path / "c.pt").exists()
    finally:
        live.kill()
        live.wait()


# ----------------------------------------------------------------------------- 3. a damaged feature cache heals
@pytest.mark.slow
def test_truncated_or_empty_feature_cache_is_named_recomputed_and_rewritten(tiny_checkpoints, tmp_path, capsys):
    cache = tmp_path / "cache"
    argv = ["eval", tiny_checkpoints["decayed"], "--evals", "knn", "--no-baselines", "--no-progress",
            "--cache-dir", str(cache), "--out", str(tmp_path / "o")]
    code, first, err = run(capsys, *argv)
    assert code == 0, err
    train_file, test_file = sorted(cache.glob("train-*.pt")), sorted(cache.glob("test-*.pt"))
    assert len(train_file) == len(test_file) == 1
    good = train_file[0].read_bytes()
    train_file[0].write_bytes(good[: len(good) // 2])  # truncated (a kill mid-copy, a full disk)
    test_file[0].write_bytes(b"")  # empty
    code, again, err = run(capsys, *argv)
    assert code == 0, err
    warnings = [ln for ln in err.splitlines() if ln.strip()]
    assert len(warnings) == 2 and all(ln.startswith("resdecay: warning: feature cache ") for ln in warnings), err
    assert str(train_file[0]) in err and str(test_file[0]) in err and "recomputing" in err
    assert "Traceback" not in err
    assert train_file[0].read_bytes() != good[: len(good) // 2] and torch.load(train_file[0], weights_only=True)["labels"].numel()
    assert not list(cache.glob(".*tmp-*"))
    knn = lambda text: [ln for ln in text.splitlines() if ln.startswith("knn")]  # noqa: E731
    assert knn(again) == knn(first)


# ----------------------------------------------------------------------------- 5. messages that do not mislead
class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo should-never-run",))


def test_refused_and_unreadable_checkpoints_say_what_the_file_is(capsys, tmp_path):
    files = {"code": tmp_path / "code.pt", "text": tmp_path / "notes.pt", "empty": tmp_path / "empty.pt",
             "truncated": tmp_path / "trunc.pt", "npy": tmp_path / "arr.pt"}
    torch.save({"model": _RunsCode()}, files["code"])
    files["text"].write_text("step,loss\n1,0.5\n")
    files["empty"].write_bytes(b"")
    torch.save({"model": torch.zeros(4096)}, files["truncated"])
    files["truncated"].write_bytes(files["truncated"].read_bytes()[:3000])
    import numpy as np
    with open(files["npy"], "wb") as f:
        np.save(f, np.zeros(3))
    expect = {"code": "contains code-bearing Python objects such as posix.system and is refused for safety",
              "text": "it is a text file, not a torch file; it starts 'step,loss 1,0.5'", "empty": "the file is empty",
              "truncated": "it is truncated or damaged: an incomplete zip archive of 3000 bytes",
              "npy": "it is a NumPy .npy file, not a torch file"}
    for name, f in files.items():
        code, out, err = run(capsys, "eval", str(f), "--no-progress", "--cache-dir", str(tmp_path / "c"))
        assert_one_line_error(code, err, f"{f} is not a readable resdecay checkpoint", expect[name].replace("posix", os.name))
        assert "should-never-run" not in out and "Re-running" not in err and "weights_only" not in err
        assert err.rstrip().endswith(")")  # the reason is whole, not cut mid-word


def test_preset_descriptions_are_whole_sentences(capsys):
    code, out, _ = run(capsys, "presets")
    lines = dict(ln.split(None, 1) for ln in out.splitlines())
    assert "class-conditional with label dropout 0.1" in lines["sit-tiny-fmnist"]
    assert lines["mae-tiny-fmnistm"].endswith("background, colour, scale and position are nuisance)")
    assert all(not d.rstrip().endswith((",", "-", "(")) for d in lines.values()), out


# ----------------------------------------------------------------------------- 1. bad image files
@pytest.fixture
def bad_imagefolder(fake_imagefolder):
    """The fake ImageFolder with two unreadable files: a text file named .png and a truncated PNG."""
    (fake_imagefolder / "train" / "cat" / "junk.png").write_text("not an image\n")
    whole = (fake_imagefolder / "train" / "dog" / "0.png").read_bytes()
    (fake_imagefolder / "train" / "dog" / "9.png").write_bytes(whole[: len(whole) // 2])
    return fake_imagefolder


def _folder_run(root, out, *extra):
    return load_config("mae-tiny-digits", [*TINY, "data.name=imagefolder", f"data.path={root}", "model.in_chans=3",
                                           "train.batch_size=4", "train.epochs=2", "train.log_every=1", f"train.threads={THREADS}",
                                           f"train.out_dir={out}", *extra])


def test_check_data_lists_every_unreadable_file_at_once(capsys, bad_imagefolder):
    code, out, err = run(capsys, "check-data", "--data-path", str(bad_imagefolder), "--no-progress", "--workers", "2")
    assert_one_line_error(code, err, "2 of 18 images", "are unreadable (listed above)", "data.on_bad_file=skip")
    assert "train: 14 images, 2 unreadable" in out and "val: 4 images, 0 unreadable" in out
    listed = [ln for ln in out.splitlines() if ln.startswith(str(bad_imagefolder))]
    assert sorted(ln.split()[0].rsplit("/", 2)[-2] + "/" + ln.split()[0].rsplit("/", 1)[-1] for ln in listed) == [
        "cat/junk.png", "dog/9.png"]
    assert any("truncated" in ln for ln in listed), out
    (bad_imagefolder / "train" / "cat" / "junk.png").unlink()
    (bad_imagefolder / "train" / "dog" / "9.png").unlink()
    code, out, err = run(capsys, "check-data", "--data-path", str(bad_imagefolder), "--no-progress")
    assert code == 0 and "16 images decoded" in out, err


def test_pretrain_check_data_stops_before_training_and_leaves_no_run_folder(capsys, bad_imagefolder, tmp_path):
    out = tmp_path / "run"
    argv = ["pretrain", "--preset", "mae-tiny-digits", "--no-progress", "--check-data", *TINY, "data.name=imagefolder",
            f"data.path={bad_imagefolder}", "model.in_chans=3", "train.batch_size=4", f"train.out_dir={out}"]
    code, stdout, err = run(capsys, *argv)
    assert_one_line_error(code, err, "2 of 18 images")
    assert "junk.png" in stdout and "9.png" in stdout and not out.exists()


@pytest.mark.slow
def test_bad_files_stop_by_default_and_skip_replaces_them_deterministically(bad_imagefolder, tmp_path, capsys):
    from resdecay.errors import DataError
    from resdecay.train import checkpoint as ckpt

    with pytest.raises(DataError, match="cannot read image .*(junk|9).png.*data.on_bad_file=skip"):
        train(_folder_run(bad_imagefolder, tmp_path / "stop"), progress=False)
    a = train(_folder_run(bad_imagefolder, tmp_path / "a", "data.on_bad_file=skip", "train.ckpt_every=2",
                          "train.keep_last=10"), progress=False)
    listed = (tmp_path / "a" / "bad_files.txt").read_text().splitlines()
    assert sorted(ln.split("\t")[0].rsplit("/", 1)[-1] for ln in listed) == ["9.png", "junk.png"]  # once each, 2 epochs
    rows = [json.loads(ln) for ln in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    assert rows[-1]["bad_files"] == 2 and "unreadable image(s) skipped so far" in capsys.readouterr().out
    # resumed mid-run from step 2 in another folder, with DataLoader workers: the same weights at the end
    mid = ckpt.checkpoint_path(tmp_path / "a" / "checkpoints", 2)
    c = train(_folder_run(bad_imagefolder, tmp_path / "c", "data.on_bad_file=skip", "data.num_workers=2"),
              resume=str(mid), progress=False)
    wa, wc = (ckpt.load_checkpoint(s["checkpoint"])["model"] for s in (a, c))
    assert a["steps"] == c["steps"] and all(torch.equal(wa[k], wc[k]) for k in wa)
    assert len((tmp_path / "c" / "bad_files.txt").read_text().splitlines()) == 2
    # a data set that changed size since the checkpoint says so in one line
    (bad_imagefolder / "train" / "dog" / "extra.png").write_bytes((bad_imagefolder / "train" / "dog" / "0.png").read_bytes())
    capsys.readouterr()
    train(_folder_run(bad_imagefolder, tmp_path / "d", "data.on_bad_file=skip"), resume=str(mid), progress=False)
    notes = [ln for ln in capsys.readouterr().out.splitlines() if "training set has" in ln]
    assert notes == [f"note: the training set has 15 images now but had 14 when {mid.name} was written; "
                     "the data order from here on differs from the original run's"]


# ----------------------------------------------------------------------------- 6. settings that silently do nothing
@pytest.mark.slow
def test_warmup_longer_than_the_run_and_a_decoder_fed_by_few_blocks_warn_once(capsys, tmp_path):
    code, out, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *SMALL, "train.warmup_epochs=3",
                         "model.depth=12", f"train.out_dir={tmp_path / 'r'}")
    assert code == 0, err
    warmup = [ln for ln in out.splitlines() if ln.startswith("warning: train.warmup_epochs=3")]
    assert len(warmup) == 1 and "never reaches its peak" in warmup[0], out
    skips = [ln for ln in out.splitlines() if ln.startswith("warning: only 2 of 12 encoder blocks feed the decoder")]
    assert len(skips) == 1 and "model.decoder_depth" in skips[0], out
    code, out, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *SMALL,
                         f"train.out_dir={tmp_path / 'quiet'}")
    assert code == 0 and "warning:" not in out, err


def test_data_path_errors_leave_no_empty_run_folder(capsys, tmp_path):
    for data in (["data.name=imagefolder", f"data.path={tmp_path / 'missing'}"],
                 ["data.name=fashion-mnist", f"data.path={tmp_path}", "model.img_size=28", "model.patch_size=4"]):
        out = tmp_path / "run"
        code, _, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *SMALL, *data,
                           f"train.out_dir={out}")
        assert_one_line_error(code, err, "data")
        assert not out.exists(), list(out.iterdir())
    kept = tmp_path / "mine"
    kept.mkdir()  # a folder the user made is left alone
    code, _, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *SMALL,
                       "data.name=imagefolder", f"data.path={tmp_path / 'missing'}", f"train.out_dir={kept}")
    assert code == 2 and kept.is_dir()


@pytest.mark.slow
def test_eval_data_path_alone_uses_the_checkpoints_data_set(capsys, tmp_path, fake_fmnist):
    summary = train(load_config("mae-tiny-fmnist", [*TINY, "train.epochs=1", f"data.path={fake_fmnist}",
                                                    f"train.out_dir={tmp_path / 'run'}"]), progress=False)
    moved = tmp_path / "elsewhere"
    fake_fmnist.rename(moved)
    code, out, err = run(capsys, "eval", summary["checkpoint"], "--data-path", str(moved), "--evals", "knn", "--k", "5",
                         "--no-baselines", "--no-progress", "--out", str(tmp_path / "o"))
    assert code == 0, err
    report = json.loads((tmp_path / "o" / "run" / "eval.json").read_text())
    card = report["results"][0]["protocol"]["train"]
    assert card["data"] == "fashion-mnist" and card["data_path"] == str(moved.resolve())
