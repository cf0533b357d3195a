"""CIFAR batches are read by a restricted unpickler: real batches load, crafted ones run nothing (issue 13, bug 7)."""

import pickle

import numpy as np
import pytest

from helpers import assert_one_line_error, run
from resdecay.data import DataConfig, build_dataset
from resdecay.errors import DataError
from resdecay.safe_pickle import load_data_pickle


class _Payload:
    """Unpickling this calls exec(), which would create ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def _write_batch(path, extra=None, protocol=4):
    batch = {"data": np.arange(4 * 3072, dtype=np.int64).astype(np.uint8).reshape(4, 3072), "labels": [0, 1, 2, 3]}
    if extra is not None:
        batch["extra"] = extra
    with open(path, "wb") as f:
        pickle.dump(batch, f, protocol=protocol)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_plain_batches_load_at_every_protocol(tmp_path, protocol):
    _write_batch(tmp_path / "b", extra=[np.int64(3), 1.5, "s", b"raw", np.float32(2)], protocol=protocol)
    got = load_data_pickle(tmp_path / "b", "cifar10 batch")
    assert got["data"].dtype == np.uint8 and got["data"].shape == (4, 3072)
    assert got["labels"] == [0, 1, 2, 3] and got["extra"][3] == b"raw"


def test_malicious_batch_runs_nothing_via_build_dataset(fake_cifar10, tmp_path):
    marker = tmp_path / "pwned"
    bad = fake_cifar10 / "cifar-10-batches-py" / "data_batch_3"
    _write_batch(bad, extra=_Payload(marker))
    with pytest.raises(DataError) as info:
        build_dataset(DataConfig("cifar10", path=str(fake_cifar10)), "train", 32)
    msg = str(info.value)
    assert "\n" not in msg and str(bad) in msg and "builtins.exec" in msg
    assert not marker.exists()


def test_malicious_batch_is_one_line_error_on_the_cli(capsys, fake_cifar10, tmp_path):
    marker = tmp_path / "pwned"
    _write_batch(fake_cifar10 / "cifar-10-batches-py" / "test_batch", extra=_Payload(marker))
    _write_batch(fake_cifar10 / "cifar-10-batches-py" / "data_batch_1", extra=_Payload(marker))
    code, _, err = run(capsys, "train-supervised", "--preset", "resnet18-cifar10", "--no-progress",
                       f"data.path={fake_cifar10}", "train.epochs=1", f"train.out_dir={tmp_path / 'run'}")
    assert_one_line_error(code, err, "data_batch_1", "refusing to load", "builtins.exec")
    assert not marker.exists()


def test_other_globals_and_codecs_are_refused(tmp_path):
    import os

    class OsCall:
        def __reduce__(self):
            return os.getcwd, ()

    _write_batch(tmp_path / "b", extra=OsCall())
    with pytest.raises(DataError, match="posix.getcwd|os.getcwd"):
        load_data_pickle(tmp_path / "b")
    # _codecs.encode is admitted for latin1 bytes only, never another codec
    import codecs

    class Rot:
        def __reduce__(self):
            return codecs.encode, ("abc", "rot13")

    _write_batch(tmp_path / "c", extra=Rot())
    with pytest.raises(DataError, match="rot13"):
        load_data_pickle(tmp_path / "c")
    (tmp_path / "d").write_bytes(b"not a pickle")
    with pytest.raises(DataError, match="cannot read"):
        load_data_pickle(tmp_path / "d")
