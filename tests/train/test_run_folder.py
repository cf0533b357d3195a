"""A finished run is never overwritten silently; a resume that would not be exact is refused unless asked."""

import json

import pytest

from helpers import TINY, assert_one_line_error, run
from resdecay.train.config import load_config

QUICK = [*TINY, "train.epochs=1", "data.train_subset=64"]


@pytest.mark.slow
def test_second_fresh_start_is_refused_and_overwrite_starts_over(capsys, tmp_path):
    out = tmp_path / "run"
    args = ["pretrain", "--preset", "mae-tiny-digits", *QUICK, f"train.out_dir={out}", "--no-progress"]
    code, _, err = run(capsys, *args)
    assert code == 0, err
    (out / "eval").mkdir()
    (out / "eval" / "eval.json").write_text("{}")  # a previous run's evaluation
    before = (out / "log.jsonl").read_text()
    code, _, err = run(capsys, *args)
    assert_one_line_error(code, err, f"{out} already holds a run", "--resume auto", "--overwrite")
    assert (out / "log.jsonl").read_text() == before  # nothing touched
    code, text, err = run(capsys, *args, "--overwrite")
    assert code == 0, err
    assert "removing the previous run" in text and not (out / "eval").exists()
    steps = [json.loads(line)["step"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # one run's log, not two interleaved


def test_default_folders_are_named_after_what_differs():
    a = load_config("mae-tiny-fmnist", ["alpha_min=0.7"]).out_dir
    b = load_config("mae-tiny-fmnist", ["alpha_min=0.8"]).out_dir
    assert a != b and str(a) == "runs/mae-tiny-fmnist_alpha_min-0.7"
    assert str(load_config("mae-tiny-fmnist").out_dir) == "runs/mae-tiny-fmnist"
    assert str(load_config("mae-tiny-fmnist", ["data.num_workers=0", "train.device=cpu"]).out_dir) == "runs/mae-tiny-fmnist"


def test_inexact_resume_is_refused_unless_allowed(capsys, tmp_path):
    out = tmp_path / "run"
    base = ["pretrain", "--preset", "mae-tiny-digits", *QUICK, f"train.out_dir={out}", "--no-progress"]
    code, _, err = run(capsys, *base)
    assert code == 0, err
    code, _, err = run(capsys, *base, "train.epochs=2", "train.batch_size=32", "--resume", "auto")
    assert_one_line_error(code, err, "cannot resume", "train.batch_size 64 -> 32", "--allow-changes")
    assert "train.epochs" not in err  # extending a run is allowed (and noted)
    code, text, err = run(capsys, *base, "train.epochs=2", "train.batch_size=32", "--resume", "auto", "--allow-changes")
    assert code == 0, err
    assert "no longer matches an uninterrupted one" in text
    # harmless changes (workers, logging) resume without a flag
    code, _, err = run(capsys, *base, "train.epochs=2", "train.batch_size=32", "train.log_every=3", "--resume", "auto")
    assert code == 0, err
