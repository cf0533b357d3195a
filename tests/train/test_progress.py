"""Progress bars only where they can redraw themselves (issue 23.10): tqdm wrote carriage-return frames into
logs redirected to a file; now every bar goes through ``resdecay.io.progress_bar``, which draws on a terminal
and stays silent when stderr is a file or a pipe (as pip does)."""

from __future__ import annotations

import importlib
import inspect
import io
import subprocess
import sys

import pytest

from helpers import TINY
from resdecay.cli import main
from resdecay.io import interactive_stderr, progress_bar


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_is_drawn_on_a_terminal_only(monkeypatch):
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert interactive_stderr() and list(progress_bar(range(3), desc="t")) == [0, 1, 2]
    assert "\r" in term.getvalue() and "t: 100%" in term.getvalue()
    term = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert list(progress_bar(range(3), disable=True)) == [0, 1, 2] and term.getvalue() == ""  # progress=False
    log = io.StringIO()  # a redirected log
    monkeypatch.setattr(sys, "stderr", log)
    bar = progress_bar(total=3)  # a manual bar, as the training loop's
    bar.update(3)
    bar.set_postfix(loss="0.1")
    bar.close()
    assert not interactive_stderr() and list(progress_bar(range(3))) == [0, 1, 2] and log.getvalue() == ""


def test_stderr_without_isatty_counts_as_not_a_terminal(monkeypatch):
    class Bare:
        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Bare())
    assert not interactive_stderr()


def test_training_log_redirected_to_a_file_has_no_bar_frames(capsys, tmp_path):
    """`resdecay pretrain` with its bar on (no --no-progress) and stderr captured, as in `... 2> log`."""
    code = main(["pretrain", "--preset", "mae-tiny-digits", *TINY, "train.epochs=1", "data.train_subset=256",
                 f"train.out_dir={tmp_path / 'r'}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "done: " in out and "\r" not in err and "step/s" not in err and "\r" not in out


def test_redirected_subprocess_gets_no_frames(tmp_path):
    """The same for a real process writing to a file (what a user's `2> log` gives)."""
    log = tmp_path / "err.log"
    code = "from resdecay.io import progress_bar\nfor _ in progress_bar(range(50), desc='x'):\n    pass\n"
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-c", code], stderr=f, check=True, timeout=120)
    assert log.read_text() == ""


@pytest.mark.parametrize("module", ["resdecay.train.loop", "resdecay.data.vae", "resdecay.eval.fid.stats",
                                    "resdecay.eval.features.extract", "resdecay.eval.features.probe", "resdecay.commands.finetune",
                                    "resdecay.eval.classifier_eval",
                                    "resdecay.diffusion.samplers"])
def test_no_call_site_uses_tqdm_directly(module):
    """Every bar of the package goes through progress_bar, so none can write frames into a redirected log."""
    source = inspect.getsource(importlib.import_module(module))
    assert "tqdm" not in source.replace("progress_bar", "")
