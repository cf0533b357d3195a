"""Issue 30, items 8 and 9: bad input is one line naming the problem and the fix (exit 2), not a stack
trace from deep inside a library, and nothing hangs. The submit cases are in test_submit.py (they share
its fake sbatch), the tracker resume cases in test_trackers.py, the FID references in test_fid.py."""

from __future__ import annotations

import builtins
import io
import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import TINY, assert_one_line_error, run
from resdecay.cli import plugins
from resdecay.errors import CheckpointError, ConfigError
from resdecay.train import checkpoint as ckpt
from resdecay.train.config import load_config
from resdecay.train.run.runlock import run_lock

FAST_EVAL = ["--no-progress", "--evals", "knn", "--no-baselines", "--max-train", "200", "--max-test", "100"]


def pretrain(out: Path, *extra: str) -> list[str]:
    return ["pretrain", "--preset", "mae-tiny-digits", "--no-progress", *TINY, "train.epochs=1", "data.train_subset=128",
            "train.threads=1", f"train.out_dir={out}", *extra]


# ----------------------------------------------------------------------------- item 8
def test_compare_of_an_eval_json_that_is_not_utf8_is_one_line(capsys, tmp_path):
    for name, data in (("good", json.dumps({"results": []}).encode()), ("bad", b"\xff\xfe{\"results\": []}")):
        (tmp_path / name / "eval").mkdir(parents=True)
        (tmp_path / name / "eval" / "eval.json").write_bytes(data)
    code, _, err = run(capsys, "compare", str(tmp_path / "good"), str(tmp_path / "bad"))
    assert_one_line_error(code, err, "bad/eval/eval.json", "not valid UTF-8 JSON", "resdecay eval")


def test_the_csv_logger_with_a_folder_named_summary_csv_is_one_line(capsys, tmp_path):
    (tmp_path / "run" / "summary.csv").mkdir(parents=True)
    code, _, err = run(capsys, *pretrain(tmp_path / "run", "train.loggers=[csv]"))
    assert_one_line_error(code, err, "summary.csv is a folder", "drop csv from train.loggers")


@pytest.mark.parametrize("name, body, fragments", [
    ("notes.txt", "print('hi')\n", ["notes.txt is not a .py file"]),  # was AttributeError: 'NoneType' ... 'loader'
    ("stop.py", "raise KeyboardInterrupt\n", ["stop.py failed to load: KeyboardInterrupt", "fix the plugin"]),
    ("leave.py", "raise SystemExit(3)\n", ["leave.py failed to load: SystemExit"]),
    ("a-folder", None, ["a-folder is a folder", ".py file"]),  # item 9: was "no such file"
])
def test_a_plugin_that_cannot_be_loaded_is_one_line(capsys, tmp_path, name, body, fragments):
    path = tmp_path / name
    if body is None:
        path.mkdir()
    else:
        path.write_text(body)
    code, _, err = run(capsys, "--plugin", str(path), "presets")
    assert_one_line_error(code, err, *fragments)


def refuse_writes_under(monkeypatch, folder: Path) -> None:
    """``folder`` behaves as on a read-only disk (chmod does not bind root, who runs CI): opening a file
    in it for writing fails with EACCES, for Python's ``open`` and for TensorBoard's writer thread alike."""
    real_open = builtins.open

    def guarded(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and os.fsdecode(file).startswith(str(folder)):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)


def test_eval_of_a_run_whose_tensorboard_folder_is_read_only_prints_numbers_and_one_note(capsys, tmp_path, tiny_checkpoints,
                                                                                         monkeypatch):
    """Issue 30.8: the numbers came with a 40-line traceback from TensorBoard's writer thread."""
    run_dir = tmp_path / "theirs"
    shutil.copytree(Path(tiny_checkpoints["decayed"]).parent.parent, run_dir)
    refuse_writes_under(monkeypatch, run_dir / "tb")
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)  # print as outside pytest (which collects it)
    code, out, err = run(capsys, "eval", str(run_dir / "checkpoints" / Path(tiny_checkpoints["decayed"]).name), *FAST_EVAL,
                         "--out", str(tmp_path / "mine"), "--cache-dir", str(tmp_path / "cache"))
    assert code == 0, err
    assert "knn" in out and (tmp_path / "mine" / "theirs" / "eval.json").is_file()
    assert "Traceback" not in err and "Exception in thread" not in err, err
    notes = [ln for ln in (out + err).splitlines() if "not logged" in ln]
    assert len(notes) == 1 and "TensorBoard cannot write to" in notes[0] and "Permission denied" in notes[0], out + err


@pytest.mark.parametrize("seed", [-1, 2**32, 99999999999999999999])
def test_train_seed_outside_the_numpy_and_torch_range_is_one_line(capsys, tmp_path, seed):
    with pytest.raises(ConfigError, match=r"train.seed must be an integer in \[0, 2\*\*32\)"):
        load_config("mae-tiny-digits", [f"train.seed={seed}"])
    code, _, err = run(capsys, *pretrain(tmp_path / "run", f"train.seed={seed}"))
    assert_one_line_error(code, err, "train.seed", "2**32")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_ablate_seeds_beyond_2_32_and_demo_seed_minus_1_are_refused_like_negative_seeds(capsys, tmp_path):
    code, _, err = run(capsys, "ablate", "--grid", "figure7-toy", "--seeds", "0,99999999999999999999", "--out", str(tmp_path))
    assert_one_line_error(code, err, "99999999999999999999 is 2**32 or more", "--seeds 0,1,2")
    code, _, err = run(capsys, "demo", "--seed", "-1", "--out", str(tmp_path / "demo"))  # item 9: was accepted
    assert_one_line_error(code, err, "--seed must be an integer in [0, 2**32), got -1")
    assert not (tmp_path / "demo").exists()


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_mlflow_server_is_one_line_within_the_timeout_and_frees_the_run_folder(capsys, tmp_path, monkeypatch):
    """Issue 30.8: MLflow retried a refused connection for minutes, printing nothing, holding run.lock."""
    pytest.importorskip("mlflow", reason="pip install -e '.[mlflow]' (in the test extra)")
    port = closed_port()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    t0 = time.monotonic()
    code, _, err = run(capsys, *pretrain(tmp_path / "run", "train.loggers=[mlflow]"))
    assert_one_line_error(code, err, f"MLflow tracking server 127.0.0.1:{port}", "not reachable", "MLFLOW_TRACKING_URI")
    assert time.monotonic() - t0 < 30
    (tmp_path / "run").mkdir(exist_ok=True)
    with run_lock(tmp_path / "run"):  # no lock is left held: the next launch is not refused as busy
        pass


@pytest.mark.parametrize("store", ["http", "file"])
@pytest.mark.parametrize("value", ["soon", "", "-3"])
def test_a_bad_mlflow_timeout_setting_is_one_line(capsys, tmp_path, monkeypatch, store, value):
    """Also with the run folder's file store, where it was wrapped in "MLflow could not start a run ...; check
    MLFLOW_TRACKING_URI" (issue 38.7's setting, named as the thing to fix)."""
    pytest.importorskip("mlflow", reason="pip install -e '.[mlflow]' (in the test extra)")
    if store == "http":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{closed_port()}")
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", value)
    code, _, err = run(capsys, *pretrain(tmp_path / "run", "train.loggers=[mlflow]"))
    assert_one_line_error(code, err, f"MLFLOW_HTTP_REQUEST_TIMEOUT={value!r} is not a number of seconds")
    assert "MLFLOW_TRACKING_URI" not in err
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- item 9
def test_a_checkpoint_of_a_plugin_family_without_its_plugin_names_the_file_it_was_trained_with(capsys, tmp_path,
                                                                                                 monkeypatch):
    """Checkpoints record the plugins loaded; eval / load of one whose family is not registered here
    names them, instead of "model.family 'mixer' is unknown"."""
    mine = tmp_path / "mine.py"
    mine.write_text("# registers nothing: what is tested is that the checkpoint records it\n")
    monkeypatch.setattr(plugins, "LOADED", [])
    plugins.load_plugin(str(mine))
    code, _, err = run(capsys, *pretrain(tmp_path / "run"))
    assert code == 0, err
    path = ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")[-1]
    state = torch.load(path, weights_only=False)
    assert state["plugins"] == [str(mine.resolve())]
    state["config"]["model"]["family"] = "mixer"  # as the docs' example family would be stored
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=rf"family 'mixer'.*resdecay --plugin {mine.resolve()}"):
        ckpt.load_model(path)
    code, _, err = run(capsys, "eval", str(path), *FAST_EVAL, "--out", str(tmp_path / "ev"))
    assert_one_line_error(code, err, "family 'mixer'", f"--plugin {mine.resolve()}")
    del state["plugins"]  # a checkpoint from before they were recorded
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"family 'mixer'.*--plugin FILE.py"):
        ckpt.load_model(path)


def test_a_preset_of_a_plugin_family_without_the_plugin_is_one_line_without_a_keyerror_repr(capsys, tmp_path):
    preset = tmp_path / "mixer-digits.yaml"
    preset.write_text("model:\n  family: mixer\n  depth: 2\ndata:\n  name: digits\n")
    for overrides in ([], ["train.epochs=1"]):  # with overrides it was KeyError's repr, in quotes
        code, _, err = run(capsys, "pretrain", "--preset", str(preset), f"train.out_dir={tmp_path / 'run'}", "--resume", "auto",
                           *overrides)
        assert_one_line_error(code, err, "model.family 'mixer' is unknown", "--plugin FILE.py")
        assert "error: \"" not in err


def test_eval_of_an_exported_hf_folder_points_to_from_pretrained(capsys, tmp_path, tiny_checkpoints):
    code, _, err = run(capsys, "export", tiny_checkpoints["decayed"], "--to", "hf", "--out", str(tmp_path / "hf"))
    assert code == 0, err
    for given in (tmp_path / "hf", tmp_path / "hf" / "model.safetensors"):
        code, _, err = run(capsys, "eval", str(given), *FAST_EVAL, "--out", str(tmp_path / "ev"))
        assert_one_line_error(code, err, "export --to hf", f"resdecay.from_pretrained('{tmp_path / 'hf'}')")
        assert "facebookresearch" not in err and "does not exist" not in err
        with pytest.raises(CheckpointError, match="from_pretrained"):
            ckpt.load_model(given)


def test_a_grid_yaml_that_is_a_list_is_one_line(capsys, tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text("- name: plain\n- name: decayed\n")
    code, _, err = run(capsys, "ablate", "--grid", str(grid), "--out", str(tmp_path / "out"))
    assert_one_line_error(code, err, "holds a YAML list, not a mapping", "variants")


def test_a_list_setting_given_as_one_word_shows_a_list_of_its_own_kind(capsys, tmp_path):
    code, _, err = run(capsys, *pretrain(tmp_path / "run", "train.loggers=wandb"))
    assert_one_line_error(code, err, "train.loggers must be a list like [tensorboard,wandb]", "train.loggers=[wandb]")
    assert "[1, 3]" not in err


def test_the_demo_refuses_an_unwritable_out_naming_out(capsys, tmp_path):
    (tmp_path / "a-file").write_text("x")
    code, _, err = run(capsys, "demo", "--data", "digits", "--out", str(tmp_path / "a-file" / "demo"))
    assert_one_line_error(code, err, "is not writable", "--out DIR")
    assert "train.out_dir" not in err


@pytest.mark.parametrize("shape, fragment", [((10,), "(N, H, W, C)"), ((10, 8, 8, 3, 2), "(N, H, W, C)"),
                                             ((10, 8, 8, 2), "(N, H, W, C)")])
def test_a_wrong_rank_array_is_told_its_shape_not_the_uint8_conversion(capsys, tmp_path, shape, fragment):
    np.save(tmp_path / "x.npy", np.zeros(shape, np.uint8))
    code, _, err = run(capsys, "fid", str(tmp_path / "x.npy"), "--ref", "digits", "--proxy")
    assert_one_line_error(code, err, f"shape {shape}", fragment)
    assert "astype(np.uint8)" not in err
    np.save(tmp_path / "f.npy", np.zeros((10, 8, 8, 1), np.float32))  # the dtype still gets the conversion
    code, _, err = run(capsys, "fid", str(tmp_path / "f.npy"), "--ref", "digits", "--proxy")
    assert_one_line_error(code, err, "astype(np.uint8)")



# ----------------------------------------------------------------------------- issue 38, items 8 and 9
def test_eval_of_a_transformers_vitmae_folder_points_to_import_weights_not_from_pretrained(capsys, tmp_path,
                                                                                          tiny_checkpoints):
    """Issue 38.8: `resdecay eval <transformers folder>` recommended from_pretrained, which refuses that folder."""
    pytest.importorskip("transformers", reason="pip install -e '.[hf]' (in the test extra)")
    folder = tmp_path / "vitmae"
    code, _, err = run(capsys, "export", tiny_checkpoints["plain"], "--to", "hf-vitmae", "--out", str(folder))
    assert code == 0, err
    for given in (folder, folder / "model.safetensors"):
        code, _, err = run(capsys, "eval", str(given), *FAST_EVAL, "--out", str(tmp_path / "ev"))
        assert_one_line_error(code, err, "a transformers vit_mae",
                              f"resdecay import-weights {folder} --format hf-vitmae --preset PRESET --out imported.pt")
        assert "from_pretrained" not in err
    assert not (tmp_path / "ev").exists()
    code, _, err = run(capsys, "import-weights", str(folder), "--format", "hf-vitmae", "--preset", "mae-tiny-digits-plain",
                       "--out", str(tmp_path / "imported.pt"))  # the route it names works
    assert code == 0, err
    code, _, err = run(capsys, "eval", str(tmp_path / "imported.pt"), *FAST_EVAL, "--out", str(tmp_path / "ev"))
    assert code == 0, err
    other = tmp_path / "vit"  # a transformers model of another kind: eval --model measures it (issue 49.12)
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "vit", "architectures": ["ViTModel"]}))
    (other / "model.safetensors").write_bytes(b"")
    code, _, err = run(capsys, "eval", str(other), *FAST_EVAL, "--out", str(tmp_path / "ev2"))
    assert_one_line_error(code, err, "a transformers vit save_pretrained folder", f"resdecay eval --model {other} --data NAME")
    assert "from_pretrained" not in err


def test_a_refused_eval_leaves_no_empty_report_or_cache_folder(capsys, tmp_path, tiny_checkpoints):
    """Issue 38.9: an eval refused after its inputs were checked (here: k larger than the bank) left an empty
    <out>/<run>/; an --out that existed before is kept as it was."""
    argv = ["eval", tiny_checkpoints["decayed"], "--no-progress", "--evals", "knn", "--no-baselines", "--max-train", "50",
            "--k", "60", "--cache-dir", str(tmp_path / "cache" / "features")]
    code, _, err = run(capsys, *argv, "--out", str(tmp_path / "ev"))
    assert_one_line_error(code, err, "--k 60 is larger than the kNN bank")
    assert not (tmp_path / "ev").exists() and not (tmp_path / "cache").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    code, _, err = run(capsys, *argv, "--out", str(mine))
    assert_one_line_error(code, err, "--k 60 is larger than the kNN bank")
    assert mine.is_dir() and not any(mine.iterdir())
