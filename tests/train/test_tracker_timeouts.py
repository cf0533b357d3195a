"""Issue 38.7: a tracker server that accepts and never answers is one line within its timeout, not a silent hang
holding run.lock; a bad timeout setting is one line; the run lock is released and removed on every exit."""

import contextlib
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from helpers import assert_one_line_error, run
from helpers.trackers import RUN, needs, offline
from resdecay.train.distributed import DistEnv
from resdecay.train.log.remote_trackers import TrackerStartError, wandb_timeout
from resdecay.train.run import runlock
from resdecay.train.run.run_folder import run_folder


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    offline(monkeypatch)


@contextlib.contextmanager
def silent_server():
    """A local TCP server (127.0.0.1, a free port) that accepts every connection and never answers; it stops,
    closing what it accepted, when the block ends. Yields its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.1)
    held, stop = [], threading.Event()

    def serve():
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:  # the accept timeout: look at stop again
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        srv.close()


def tracked_start(capsys, out: Path, logger: str) -> tuple[int, str, float]:
    """``pretrain`` into ``out`` logging to ``logger``: (exit code, stderr, seconds)."""
    t0 = time.monotonic()
    code, _, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *RUN, f"train.out_dir={out}",
                       f"train.loggers=[{logger}]")
    return code, err, time.monotonic() - t0


def test_an_mlflow_server_that_accepts_and_never_answers_is_one_line_within_the_timeout(capsys, tmp_path, monkeypatch):
    """Issue 38.7: the port accepted and never answered; pretrain hung silently (>= 220 s) holding run.lock."""
    needs("mlflow")
    out = tmp_path / "run"
    with silent_server() as port:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
        code, err, seconds = tracked_start(capsys, out, "mlflow")
    assert_one_line_error(code, err, f"MLflow tracking server 127.0.0.1:{port}", "did not answer a request",
                          "waited up to 1 s", "MLFLOW_TRACKING_URI")
    assert seconds < 30, seconds
    assert not out.exists()  # no run.lock (nor anything else) left behind
    mine = tmp_path / "mine"  # a folder of the user's: kept as it was, the lock released and removed
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with silent_server() as port:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        code, err, _ = tracked_start(capsys, mine, "mlflow")
    assert_one_line_error(code, err, "did not answer a request")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"] and not runlock._held


@pytest.mark.slow
def test_a_wandb_server_that_accepts_and_never_answers_is_one_line_within_the_timeout(capsys, tmp_path, monkeypatch):
    """Issue 38.7, W&B's side: wandb.init waits WANDB_INIT_TIMEOUT seconds (W&B's setting, passed on) for its server."""
    wandb = needs("wandb")
    wandb.teardown()  # a session an earlier test started ignores these variables (wandb reads them once per session)
    out = tmp_path / "run"
    with silent_server() as port:
        for name, value in (("WANDB_MODE", "online"), ("WANDB_BASE_URL", f"http://127.0.0.1:{port}"),
                            ("WANDB_API_KEY", "x" * 40), ("WANDB_INIT_TIMEOUT", "2")):
            monkeypatch.setenv(name, value)
        try:
            code, err, seconds = tracked_start(capsys, out, "wandb")
        finally:
            wandb.teardown()
    assert_one_line_error(code, err, "Weights & Biases could not start a run within 2 s", "WANDB_INIT_TIMEOUT")
    assert seconds < 90, seconds
    assert not out.exists()


@pytest.mark.parametrize("timeout", ["soon", "0", "-1", "nan", "inf", ""])
def test_a_bad_tracker_timeout_is_one_line(capsys, tmp_path, monkeypatch, timeout):
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", timeout)
    with pytest.raises(TrackerStartError, match=re.escape(f"WANDB_INIT_TIMEOUT={timeout!r} is not a number of seconds")):
        wandb_timeout()


@pytest.mark.parametrize("failure", [KeyboardInterrupt, TrackerStartError, RuntimeError, None])
def test_the_run_lock_is_released_and_removed_on_every_exit(tmp_path, failure):
    """Issue 38.7: a run that finished, failed or was interrupted (while its trackers started, say) leaves no run.lock."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "log.jsonl").write_text("")  # a run's folder: what it holds is kept
    with contextlib.ExitStack() as stack:
        if failure is not None:
            stack.enter_context(pytest.raises(failure))
        with run_folder(out, DistEnv(), print):
            assert runlock.holder_of(out)["pid"] == os.getpid()
            if failure is not None:
                raise failure("while the trackers started")
    assert not (out / runlock.LOCK_NAME).exists() and not runlock._held
    with runlock.run_lock(out):  # free: the next launch is not refused
        pass


def test_a_released_lock_removes_only_its_own_file(tmp_path):
    with runlock.run_lock(tmp_path):
        (tmp_path / runlock.LOCK_NAME).unlink()  # removed while held (a failed start's clean-up) and made anew
        (tmp_path / runlock.LOCK_NAME).write_text("{}")
    assert (tmp_path / runlock.LOCK_NAME).read_text() == "{}"  # not ours: left alone
