"""``resdecay submit`` (issue 22.2): SLURM jobs through submitit, tested without a cluster. The local
executor runs the job in subprocesses here (its end-of-job signal, SIGUSR2, is sent by the test as the
controller sends it at a timeout), the debug executor in this process; a fake ``sbatch`` shows what
would reach SLURM."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import sys
import time
from types import SimpleNamespace

import pytest
import submitit  # the `test` extra installs it (pip install -e '.[test]')
import torch

from helpers import TINY, assert_one_line_error, run
from resdecay.commands.submit import JOBS_FILE, read_jobs, torchrun_variables
from resdecay.train import checkpoint as ckpt
from resdecay.train.log.runlog import read_log

TIMED = ("img_per_s", "time_s", "peak_mem_mb")


def pretrain(out, *extra):
    return ["pretrain", "--preset", "mae-tiny-digits", "--no-progress", *TINY, "train.threads=1", f"train.out_dir={out}", *extra]


def untimed_rows(run_dir) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMED} for row in read_log(run_dir)]


def wait_for(condition, what: str, timeout: float = 240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def local_result(folder, job_id):
    """The local job's result once its controller is done (the job outlives the submitting call)."""
    wait_for(lambda: (folder / f"{job_id}_0_result.pkl").exists(), f"job {job_id} to finish")
    return submitit.local.local.LocalJob(folder, job_id).result()


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("argv, fragments", [
    (["--timeout-min", "5"], ["needs a command", "pretrain"]),
    (["--timeout-min", "5", "evaluate"], ["got 'evaluate'", "train-supervised"]),
    (["--timeout-min", "5", "--nodes", "0", "pretrain", "--preset", "mae-tiny-digits"], ["--nodes", ">= 1", "got 0"]),
    (["--timeout-min", "0", "pretrain", "--preset", "mae-tiny-digits"], ["--timeout-min"]),
    (["--timeout-min", "5", "--executor", "pbs", "pretrain", "--preset", "mae-tiny-digits"], ["pbs", "slurm, local, debug"]),
    (["--timeout-min", "5", "--executor", "local", "--nodes", "2", "pretrain", "--preset", "mae-tiny-digits"], ["--nodes 1"]),
    (["--timeout-min", "5", "--executor", "debug", "--tasks-per-node", "2", "pretrain", "--preset", "mae-tiny-digits"], ["--executor local"]),
    (["--timeout-min", "5", "--executor", "debug", "pretrain"], ["--preset"]),
    (["--timeout-min", "5", "--executor", "debug", "pretrain", "--preset", "mae-tiny-digits", "--bogus"], ["--bogus"]),
    (["--timeout-min", "5", "--executor", "debug", "pretrain", "--preset", "nope"], ["nope"]),
    (["--timeout-min", "5", "--executor", "debug", "pretrain", "--preset", "mae-tiny-digits", "--overwrite"], ["--overwrite"]),
    (["--timeout-min", "5", "--executor", "debug", "pretrain", "--preset", "mae-tiny-digits", "--resume", "x.pt"],
     ["--resume auto"]),
    (["--timeout-min", "5", "--executor", "debug", "ablate", "--list"], ["--grid"]),
    (["--timeout-min", "5", "--executor", "debug", "finetune", "missing.pt"], ["missing.pt", "does not exist"]),
])
def test_bad_input_is_one_line(capsys, tmp_path, argv, fragments):
    code, _, err = run(capsys, "submit", *argv)
    assert_one_line_error(code, err, *fragments)
    assert not list(tmp_path.iterdir())  # nothing was queued or written


def test_missing_submitit_or_sbatch_is_one_line_naming_the_fix(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no srun
    code, _, err = run(capsys, "submit", "--timeout-min", "5", "pretrain", "--preset", "mae-tiny-digits")
    assert_one_line_error(code, err, "no sbatch", "--executor local")
    monkeypatch.setitem(sys.modules, "submitit", None)  # as if the extra were not installed
    code, _, err = run(capsys, "submit", "--timeout-min", "5", "--executor", "debug", "pretrain", "--preset", "mae-tiny-digits")
    assert_one_line_error(code, err, "pip install -e '.[slurm]'")


def test_a_folder_that_holds_a_run_is_refused_as_pretrain_refuses_it(capsys, tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "log.jsonl").write_text("")
    code, _, err = run(capsys, "submit", "--timeout-min", "5", "--executor", "debug", *pretrain(out))
    assert_one_line_error(code, err, "already holds a run", "--resume auto")
    assert not (out / JOBS_FILE).exists()


# ----------------------------------------------------------------------------- what the tasks see
def test_torchrun_variables_come_from_the_slurm_job_environment(monkeypatch):
    """Task 9 of a 2-node x 8-GPU SLURM job gets what torchrun would give it."""
    slurm = {"SLURM_JOB_ID": "734", "SLURM_NTASKS": "16", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
             "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_PROCID": "9", "SLURM_LOCALID": "1"}
    for k, v in slurm.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    env = submitit.slurm.slurm.SlurmJobEnvironment()
    variables = torchrun_variables(env)
    assert variables == {"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
                         "MASTER_ADDR": "gpu07", "MASTER_PORT": str(20000 + 734)}
    monkeypatch.setenv("MASTER_PORT", "29555")  # an exported port wins
    assert torchrun_variables(env)["MASTER_PORT"] == "29555"
    # train.parallel=hsdp reads its nodes from them: shard over a node's 8 GPUs, replicate across the 2 nodes
    for k, v in variables.items():
        monkeypatch.setenv(k, v)
    from resdecay.train.parallel import node_count
    assert node_count(16) == 2 and node_count(16, nodes=4) == 4


def test_one_node_uses_loopback_and_one_task_needs_no_variables():
    one_node = SimpleNamespace(num_tasks=4, num_nodes=1, global_rank=3, local_rank=3, job_id="51_2", hostnames=["n1"])
    assert torchrun_variables(one_node)["MASTER_ADDR"] == "127.0.0.1"
    assert torchrun_variables(SimpleNamespace(num_tasks=1, num_nodes=1)) == {}
    assert torchrun_variables(None) == {}


# ----------------------------------------------------------------------------- SLURM, faked
@pytest.fixture
def fake_slurm(monkeypatch, tmp_path):
    """An sbatch (and srun) on PATH that keep the batch file in <tmp>/sbatch_input.sh and answer job 4242."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, body in (("sbatch", f'cp "$1" {tmp_path}/sbatch_input.sh\necho "Submitted batch job 4242"'), ("srun", "exit 0")):
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "sbatch_input.sh"


def test_slurm_submission_writes_the_sbatch_options_and_the_job_id(capsys, tmp_path, fake_slurm):
    """What submit hands SLURM, and what it notes in the run folder."""
    out = tmp_path / "run"
    code, printed, err = run(capsys, "submit", "--nodes", "2", "--gpus-per-node", "8", "--partition", "gpu", "--timeout-min",
                             "240", "--account", "lab", "--qos", "high", "--constraint", "a100", "--cpus-per-task", "10",
                             "--mem-gb", "400", *pretrain(out, "model.depth=6"))
    assert code == 0, err
    assert "submitted job 4242 (slurm, 2 node(s) x 8 task(s))" in printed and "--resume auto" in printed
    sbatch = fake_slurm.read_text()
    for option in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--partition=gpu", "--time=240",
                   "--account=lab", "--qos=high", "--constraint=a100", "--cpus-per-task=10", "--mem=400GB",
                   "--signal=USR2@90", "--requeue", f"--output={out / 'submitit'}"):
        assert f"#SBATCH {option}" in sbatch, option
    [event] = read_jobs(out)
    assert event["event"] == "submitted" and event["job_id"] == "4242" and event["folder"] == str(out / "submitit")
    assert event["command"].startswith("resdecay pretrain --preset mae-tiny-digits") and event["command"].endswith("--resume auto")
    assert (out / "submitit" / "4242_submitted.pkl").exists()  # the callable the job will run


def test_each_command_is_queued_into_its_own_run_folder(capsys, tmp_path, fake_slurm):
    """The run folder each command will write gets the job history; ablate resumes its variants by itself."""
    pre = tmp_path / "pre" / "checkpoints" / "step_00000004.pt"
    pre.parent.mkdir(parents=True)
    pre.write_bytes(b"")  # submit only needs it to exist; the job reads it
    cases = {"finetune": (["finetune", str(pre), "train.epochs=1"], tmp_path / "pre" / "finetune-mae", True),
             "train-supervised": (["train-supervised", "--preset", "resnet18-fmnist", f"train.out_dir={tmp_path / 'sup'}"],
                                  tmp_path / "sup", True),
             "ablate": (["ablate", "--grid", "figure7-toy", "--out", str(tmp_path / "abl")], tmp_path / "abl", False),
             # --out names the run folder as train.out_dir does (resolved at submission, relaunched unchanged)
             "pretrain --out": (["pretrain", "--preset", "mae-tiny-digits", "--out", str(tmp_path / "p")], tmp_path / "p", True),
             "finetune --out": (["finetune", str(pre), "--out", str(tmp_path / "ft")], tmp_path / "ft", True),
             # finetune --from FILE (a foreign file or folder, imported inside the job) places its run as finetune does
             "finetune --from": (["finetune", "--from", str(pre), "--preset", "linprobe-mae"], tmp_path / "pre" / "linprobe-mae",
                                 True)}
    for name, (argv, run_dir, resume) in cases.items():
        code, _, err = run(capsys, "submit", "--timeout-min", "60", *argv)
        assert code == 0, err
        [event] = read_jobs(run_dir)
        assert event["command"] == " ".join(["resdecay", *argv, *(["--resume", "auto"] if resume else [])]), name
        assert event["folder"] == str(run_dir / "submitit")


def test_plugins_travel_with_the_job(capsys, tmp_path, fake_slurm, monkeypatch):
    """A --plugin given before submit is loaded by every task too, by its absolute path (a job may start elsewhere)."""
    (tmp_path / "mine.py").write_text("# registers nothing; loading it is what is tested\n")
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "--plugin", "mine.py", "submit", "--timeout-min", "60", *pretrain(tmp_path / "run"))
    assert code == 0, err
    [event] = read_jobs(tmp_path / "run")
    assert event["command"].startswith(f"resdecay --plugin {tmp_path / 'mine.py'} pretrain --preset mae-tiny-digits")
    assert event["cwd"] == str(tmp_path)


# ----------------------------------------------------------------------------- a requeue, for real
@pytest.mark.slow
def test_a_timed_out_local_job_is_requeued_and_ends_bit_identical(capsys, tmp_path):
    """The issue's "done when": a job that gets the end-of-job signal mid-training is requeued by its
    checkpoint() and resumes with --resume auto; weights and log rows equal an uninterrupted run's."""
    # 512 training digits, 8 steps an epoch (not 22): the signal lands at the first checkpoint (step 10, the second
    # epoch), 22 steps before the end, and the requeued run still crosses two epoch boundaries
    common = ["train.epochs=4", "train.ckpt_every=10", "train.keep_last=100", "data.train_subset=512"]
    # 1. uninterrupted, through the debug executor (in this process)
    code, _, err = run(capsys, "submit", "--timeout-min", "5", "--executor", "debug", *pretrain(tmp_path / "ref", *common))
    assert code == 0, err
    # 2. through the local executor; SIGUSR2 (the signal the controller sends before the time limit) once a
    #    checkpoint is on disk. With a 5-minute limit submitit counts it as a timeout, as SLURM's would be.
    out = tmp_path / "job"
    code, _, err = run(capsys, "submit", "--timeout-min", "5", "--executor", "local", *pretrain(out, *common))
    assert code == 0, err
    wait_for(lambda: ckpt.list_checkpoints(out / "checkpoints"), "the first checkpoint")
    task = json.loads((out / "run.lock").read_text())["pid"]  # the job's training process holds the run lock
    os.kill(task, signal.SIGUSR2)
    job_id = read_jobs(out)[0]["job_id"]
    assert local_result(out / "submitit", job_id) == {"exit_code": 0, "run_dir": str(out)}

    events = read_jobs(out)
    assert [e["event"] for e in events] == ["submitted", "started", "requeued", "started"]
    assert {e["job_id"] for e in events} == {job_id} and [e["attempt"] for e in events if e["event"] == "started"] == [0, 1]
    log = (out / "submitit" / f"{job_id}_0_log.out").read_text() + (out / "submitit" / f"{job_id}_0_log.err").read_text()
    assert "this job is timed-out" in log and "Requeued job" in log
    resumed = re.search(r"resumed from \S+ at step (\d+)", log)
    assert events[2]["resume_from"] and resumed and 10 <= int(resumed.group(1)) < 4 * 8, log  # mid-run, not over
    a = ckpt.load_checkpoint(ckpt.list_checkpoints(tmp_path / "ref" / "checkpoints")[-1])
    b = ckpt.load_checkpoint(ckpt.list_checkpoints(out / "checkpoints")[-1])
    assert a["train_state"]["step"] == b["train_state"]["step"] == 4 * 8
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert untimed_rows(out) == untimed_rows(tmp_path / "ref")


@pytest.mark.slow
def test_a_local_job_of_two_tasks_trains_as_torchrun_would(capsys, tmp_path):
    """Two tasks on one node: each gets RANK / WORLD_SIZE / MASTER_* and they train as one gloo group."""
    out = tmp_path / "ddp"
    code, printed, err = run(capsys, "submit", "--timeout-min", "5", "--executor", "local", "--tasks-per-node", "2",
                             *pretrain(out, "train.epochs=1", "data.train_subset=256", "train.batch_size=32"))
    assert code == 0 and "1 node(s) x 2 task(s)" in printed, err
    job_id = read_jobs(out)[0]["job_id"]
    assert local_result(out / "submitit", job_id) == {"exit_code": 0, "run_dir": str(out)}
    state = ckpt.load_checkpoint(ckpt.list_checkpoints(out / "checkpoints")[-1])
    assert state["train_state"]["world_size"] == 2 and state["train_state"]["step"] == 4  # 256 images / (2 x 32)
    assert "device cpu x 2" in (out / "submitit" / f"{job_id}_0_log.out").read_text()
    assert [e["event"] for e in read_jobs(out)] == ["submitted", "started"]  # rank 0 alone notes the start


# ----------------------------------------------------------------------------- issue 30: cluster options, hangs
def test_cluster_specific_sbatch_options_setup_lines_and_the_signal_delay_reach_the_batch_file(capsys, tmp_path, fake_slurm):
    """Issue 30.11: #SBATCH options submit has no flag for, setup lines, and MAE's 120 s signal delay."""
    out = tmp_path / "run"
    code, _, err = run(capsys, "submit", "--timeout-min", "60", "--signal-delay", "120", "--sbatch", "comment=mae run",
                       "--sbatch", "exclusive", "--sbatch=--gres=gpu:8", "--setup", "module load cuda/12.1",
                       "--setup", "export NCCL_DEBUG=INFO", *pretrain(out))
    assert code == 0, err
    sbatch = fake_slurm.read_text()
    for line in ("#SBATCH --comment='mae run'", "#SBATCH --exclusive", "#SBATCH --gres=gpu:8", "#SBATCH --signal=USR2@120",
                 "#SBATCH --requeue"):
        assert line in sbatch.splitlines(), line
    setup = sbatch.index("module load cuda/12.1")
    assert setup < sbatch.index("export NCCL_DEBUG=INFO") < sbatch.index("submitit.core._submit")  # before the command
    [event] = read_jobs(out)
    assert event["signal_delay_s"] == 120 and event["sbatch"] == {"comment": "mae run", "exclusive": True, "gres": "gpu:8"}


@pytest.mark.parametrize("argv, fragments", [
    (["--signal-delay", "0"], ["--signal-delay", "got 0"]),
    (["--signal-delay", "3600"], ["--signal-delay", "3600 s"]),  # not before the end of a 60-minute job
    (["--sbatch", "=x"], ["--sbatch '=x'", "NAME=VALUE"]),
    (["--sbatch", "signal=USR1@60"], ["signal", "--signal-delay"]),
    (["--submit-timeout", "0"], ["--submit-timeout"]),
])
def test_bad_cluster_options_are_one_line(capsys, tmp_path, fake_slurm, argv, fragments):
    code, _, err = run(capsys, "submit", "--timeout-min", "60", *argv, *pretrain(tmp_path / "run"))
    assert_one_line_error(code, err, *fragments)
    assert not fake_slurm.exists() and not (tmp_path / "run").exists()


def test_an_sbatch_that_never_answers_is_one_line_after_the_timeout(capsys, tmp_path, fake_slurm):
    """Issue 30.8: submitit waits for sbatch without a limit, so a hung controller hung submit silently."""
    (fake_slurm.parent / "bin" / "sbatch").write_text("#!/bin/sh\nsleep 60\n")
    t0 = time.monotonic()
    code, _, err = run(capsys, "submit", "--timeout-min", "60", "--submit-timeout", "1", *pretrain(tmp_path / "run"))
    assert_one_line_error(code, err, "sbatch did not answer within 1 s", "--submit-timeout")
    assert time.monotonic() - t0 < 30  # bounded, far below the 60 s the fake sbatch sleeps


@pytest.mark.parametrize("sbatch", ["sleep 60", "exit 1"])
def test_a_timed_out_or_refused_submission_leaves_no_pickle_nor_empty_folder(capsys, tmp_path, fake_slurm, sbatch):
    """Issue 38.9: a timed-out submit left submitit's pickle of the command (and its batch file) in the folder."""
    (fake_slurm.parent / "bin" / "sbatch").write_text(f"#!/bin/sh\n{sbatch}\n")
    code, _, err = run(capsys, "submit", "--timeout-min", "60", "--submit-timeout", "1", *pretrain(tmp_path / "run"))
    assert_one_line_error(code, err, "sbatch did not answer" if "sleep" in sbatch else "submission failed")
    assert not (tmp_path / "run").exists()  # the run folder and its submitit/ were made for the job: gone with it
    jobs = tmp_path / "jobs"  # a --folder of the user's keeps what it held, and nothing of the failed submission
    jobs.mkdir()
    (jobs / "old.txt").write_text("mine")
    code, _, err = run(capsys, "submit", "--timeout-min", "60", "--submit-timeout", "1", "--folder", str(jobs),
                       *pretrain(tmp_path / "run"))
    assert code == 2, err
    assert [p.name for p in jobs.iterdir()] == ["old.txt"]


def test_an_unwritable_submitit_folder_is_one_line_naming_folder(capsys, tmp_path, fake_slurm):
    """Issue 30.8: --folder where nothing can be created was a FileNotFoundError traceback (a path through a
    file stands for an unwritable place: even root cannot create it)."""
    (tmp_path / "a-file").write_text("x")
    code, _, err = run(capsys, "submit", "--timeout-min", "60", "--folder", str(tmp_path / "a-file" / "jobs"),
                       *pretrain(tmp_path / "run"))
    assert_one_line_error(code, err, "a-file/jobs", "is not writable", "--folder")
    assert not fake_slurm.exists()
