"""The DDP code path (gloo on CPU), as `torchrun --nproc_per_node 2 -m resdecay pretrain` runs it: one run of a
tiny digits MAE, read by every check here. Starting torchrun and its two ranks costs ~10 s of a 2-core machine, so
the checks share the run (a module fixture: one xdist worker runs them all) instead of each starting its own.

- the run itself: two ranks, their RNG states in the checkpoint, the effective batch;
- issue 23.6: the logged loss was rank 0's own, every rank printed "done" and wrote summary.json;
- issue 30.7: under torchrun the online evaluation ran on every rank (kNN, probe and rank computed and printed once
  per rank). Now the ranks share the extraction, rank 0 alone measures and prints, and its numbers are those one
  process gets from the same weights.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers import TINY, free_port
from resdecay.eval.online import OnlineEval
from resdecay.train import checkpoint as ckpt
from resdecay.train.log.runlog import read_log

pytestmark = pytest.mark.slow

# `resdecay pretrain` with every local loss a rank computes recorded, and every write of summary.json by a rank
# other than 0 noted.
DRIVER = textwrap.dedent('''
    import dataclasses, json, os, pathlib, sys
    from resdecay.cli import main
    from resdecay.models import FAMILIES

    rank, record = int(os.environ["RANK"]), pathlib.Path(sys.argv[1])
    mae = FAMILIES["mae"]

    def recording(model, images, labels):  # every local loss this rank computes
        loss = mae.objective(model, images, labels)
        with open(record / f"loss{rank}.jsonl", "a") as f:
            f.write(json.dumps(float(loss)) + "\\n")
        return loss

    FAMILIES["mae"] = dataclasses.replace(mae, objective=recording)
    if rank:  # note every write of summary.json by another rank than 0
        real_write, real_replace = pathlib.Path.write_text, os.replace
        def note(target):
            if "summary.json" in str(target):
                with open(record / "other_rank_writes", "a") as f:
                    f.write(str(target) + "\\n")
        pathlib.Path.write_text = lambda self, *a, **k: (note(self), real_write(self, *a, **k))[1]
        os.replace = lambda src, dst, *a, **k: (note(dst), real_replace(src, dst, *a, **k))[1]
    sys.exit(main(sys.argv[2:]))
''')


@dataclasses.dataclass
class DDPRun:
    record: object  # the folder of the ranks' loss records
    out: object  # the run folder
    stdout: str


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """4 steps (256 images, 32 per rank), a log row per step, the online evaluation at the epoch's end."""
    record = tmp_path_factory.mktemp("ddp")
    (record / "driver.py").write_text(DRIVER)
    out = record / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(record / "driver.py"), str(record), "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *TINY,
           "train.epochs=1", "data.train_subset=256", "train.threads=1", "train.batch_size=32", "train.log_every=1",
           "train.online_eval_every=1", "train.online_eval_size=300", f"train.out_dir={out}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return DDPRun(record, out, proc.stdout)


def test_torchrun_two_processes_on_cpu(ddp_run):
    assert "effective batch 64 = 32 per device x 1 accum x 2 devices" in ddp_run.stdout
    state = ckpt.load_checkpoint(ckpt.list_checkpoints(ddp_run.out / "checkpoints")[-1])
    assert state["train_state"]["world_size"] == 2 and len(state["rng"]) == 2
    assert state["train_state"]["step"] == 256 // 2 // 32


def test_torchrun_logs_the_global_mean_and_rank_0_alone_reports(ddp_run):
    record, out = ddp_run.record, ddp_run.out
    assert ddp_run.stdout.count("done:") == 1, ddp_run.stdout
    assert not (record / "other_rank_writes").exists(), (record / "other_rank_writes").read_text()
    local = [[json.loads(x) for x in (record / f"loss{r}.jsonl").read_text().split()] for r in (0, 1)]
    rows = [r for r in read_log(out) if "loss" in r]  # the training rows (the online evaluation has its own)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and len(local[0]) == len(local[1]) == 4
    assert local[0] != local[1]  # the ranks see different images and masks
    assert [r["loss"] for r in rows] == pytest.approx([(a + b) / 2 for a, b in zip(*local, strict=True)], rel=1e-6)
    summary = json.loads((out / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in summary"))
    assert summary["final_loss"] == rows[-1]["loss"]


def test_torchrun_online_eval_runs_once_with_the_single_process_numbers(ddp_run, capsys):
    out = ddp_run.out
    assert ddp_run.stdout.count("epoch 1: online") == 1, ddp_run.stdout
    online = [r for r in read_log(out) if "online_knn_top1" in r]
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
