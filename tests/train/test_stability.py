"""The stability guardrail (train/stability.py): per-block token RMS logged at log steps, and one
warning, before the loss turns non-finite, when a block's norm explodes."""

import json
import re

import pytest

from helpers import TINY
from resdecay.errors import TrainingDiverged
from resdecay.train import train
from resdecay.train.config import load_config
from resdecay.train.stability import BlockNormMonitor, named_blocks


@pytest.mark.slow
def test_unstable_config_warns_before_the_nan_stop(tmp_path, capsys):
    # alpha_min 0.05 without zero-initialised branches at a huge lr: norms explode within steps
    cfg = load_config("mae-tiny-digits", ["alpha_min=0.05", "model.zero_init=false", "train.lr=1.0", "train.warmup_epochs=0",
                                          "train.epochs=1", "train.log_every=1", f"train.out_dir={tmp_path / 'run'}"])
    with pytest.raises(TrainingDiverged) as stop:
        train(cfg, progress=False)
    out = capsys.readouterr().out
    warning = re.search(r"warning: token RMS of (encoder|decoder) block \d+'s output .* \(step (\d+)\).*raise model.alpha_min", out)
    assert warning, out
    diverged_at = int(re.search(r"non-finite by step (\d+)", str(stop.value)).group(1))
    assert int(warning.group(2)) < diverged_at
    assert out.count("warning: token RMS") == 1  # once per run
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert rows and all(len(r["block_rms"]) == 12 + 6 for r in rows)  # 12 encoder + 6 decoder blocks of the preset


@pytest.mark.slow
def test_stable_run_logs_block_rms_without_warning(tmp_path, capsys):
    cfg = load_config("mae-tiny-digits", [*TINY, "train.epochs=1", "train.log_every=2", f"train.out_dir={tmp_path / 'run'}"])
    train(cfg, progress=False)
    assert "warning: token RMS" not in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(len(r["block_rms"]) == 4 + 2 and min(r["block_rms"]) >= 0 for r in rows)


class _Blocks:
    """The block members of the model contract, and nothing else."""

    def __init__(self, n):
        import torch.nn as nn
        self.blocks = [nn.Identity() for _ in range(n)]
        self.decoder_blocks = []


def test_growth_rule_ignores_deep_blocks_growing_to_the_input_scale_and_warns_once():
    monitor = BlockNormMonitor(_Blocks(3), growth=20, window=3)
    # a zero-initialised deep block behind a decayed shortcut grows 0.001 -> 0.5: ordinary, no warning
    for step, deep in enumerate([0.001, 0.01, 0.1, 0.5], 1):
        assert monitor.check([1.0, 0.8, deep], step) is None
    assert monitor.check([1.0, 30.0, 0.5], 5).startswith("warning: token RMS of block 1's output grew 38x")
    assert monitor.check([1.0, 3000.0, 0.5], 6) is None  # said once
    assert BlockNormMonitor(_Blocks(2), growth=20).check([1.0, 1.0], 1) is None  # nothing to compare with yet
    nan = BlockNormMonitor(_Blocks(2), growth=20)
    nan.check([1.0, 1.0], 1)
    assert "block 1's output is no longer finite" in nan.check([1.0, float("nan")], 2)


def test_named_blocks_of_an_mae_name_encoder_and_decoder():
    from resdecay.models import build_model, tiny_config
    names = [n for n, _ in named_blocks(build_model(tiny_config("mae")))]
    assert names[0] == "encoder block 0" and names[-1].startswith("decoder block")
