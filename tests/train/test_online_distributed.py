"""Issue 30.7: under torchrun the online evaluation ran on every rank (kNN, probe and rank computed
and printed once per rank). Now the ranks share the extraction, rank 0 alone measures and prints,
and its numbers are those one process gets from the same weights."""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import TINY, free_port
from resdecay.eval.online import OnlineEval
from resdecay.train import checkpoint as ckpt


@pytest.mark.slow
def test_torchrun_online_eval_runs_once_with_the_single_process_numbers(tmp_path, capsys):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "resdecay", "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *TINY, "train.epochs=1",
           "train.batch_size=32", "train.online_eval_every=1", "train.online_eval_size=300", f"train.out_dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("epoch 1: online") == 1, proc.stdout
    rows = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    online = [r for r in rows if "online_knn_top1" in r]
    assert len(online) == 1

    # the same weights (the hook runs on the epoch's last step; that step's checkpoint follows it), one process
    last = ckpt.list_checkpoints(out / "checkpoints")[-1]
    model, cfg = ckpt.load_model(last, torch.device("cpu"))
    assert ckpt.load_checkpoint(last)["train_state"]["step"] == online[0]["step"]
    logged = []

    class Log:
        def write(self, row):
            logged.append(row)

    capsys.readouterr()
    OnlineEval(cfg, 1, 300, torch.device("cpu"))(model, 0, online[0]["step"], Log())
    assert capsys.readouterr().out.count("epoch 1: online") == 1
    single = {k: v for k, v in logged[0].items() if k.startswith("online_") and isinstance(v, float)}
    assert single and single == pytest.approx({k: online[0][k] for k in single}, abs=1e-6)
    assert online[0]["online_protocol"] == json.loads(json.dumps(logged[0]["online_protocol"]))
