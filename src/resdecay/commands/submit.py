"""``resdecay submit``: run ``pretrain``, ``finetune``, ``ablate`` or ``train-supervised`` as a SLURM job
through ``submitit`` (the optional extra ``pip install -e '.[slurm]'``), requeued on preemption or timeout.

Each task of the job runs the same command ``torchrun -m resdecay ...`` would run, in-process, with the
variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) taken from SLURM's
(submitit's ``JobEnvironment``), so ``train.distributed.setup`` cannot tell the two launchers apart.
The command always carries ``--resume auto``: when SLURM announces the end of the job (submitit asks
for ``--signal=USR2@90``), the submitted callable's ``checkpoint()`` hands submitit the same command
again and the job is requeued; the new launch continues from the run folder's newest checkpoint, and
because resume is exact the finished run is bit-identical to an uninterrupted one. Steps done after
that checkpoint are trained again (``train.ckpt_every`` bounds what a preemption costs).

Every submission, start and requeue is one line of ``<run>/slurm_jobs.jsonl`` (job id, submitit folder,
hosts), so the run folder says which jobs produced it. ``--executor local`` (subprocesses on this
machine) and ``--executor debug`` (in this process) run the same path without a cluster; docs/cluster.md
has an sbatch template for those who do not use submitit.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import UserError
from ..eval.inputs import check_writable, removed_if_refused
from ..io import run_dir_of
from ..train import checkpoint as ckpt
from ..train.config import load_config, parse_overrides
from ..train.run.previous_run import check_fresh_start
from .ablate import plan_grid
from .submitit_plumbing import import_submitit, make_executor, submission_files_removed_on_failure

COMMANDS = ("pretrain", "finetune", "ablate", "train-supervised")
EXECUTORS = ("slurm", "local", "debug")
JOBS_FILE = "slurm_jobs.jsonl"
OWN_SBATCH = {"signal", "requeue", "output", "error", "open_mode", "open-mode", "job_name", "job-name"}


class SubmittedCommandFailed(RuntimeError):
    """The command a job ran exited with a non-zero code (its own error is in the job's log)."""

    def __init__(self, command: str, code: int):
        super().__init__(f"resdecay {command} exited with code {code}; its error is at the end of the job's log")
        self.code = code


@dataclass
class Resources:
    """What the job asks the scheduler for, and how it is run.

    Args:
        nodes: machines; gpus_per_node: GPUs on each (0: CPU nodes); tasks_per_node: processes on each
            (default one per GPU, as ``torchrun --nproc_per_node``; 1 without GPUs).
        timeout_min: the job's time limit; at its end the job is requeued, at most ``max_timeouts`` times
            (preemptions are not counted).
        partition, account, qos, constraint: SLURM's options of those names (None: the cluster's default).
        cpus_per_task, mem_gb: CPU cores per process and memory per node (None: the cluster's default).
        executor: slurm | local (subprocesses here) | debug (in this process); folder: submitit's folder
            (default ``<run>/submitit``).
        signal_delay_s: seconds before the time limit that SLURM signals the job (``--signal=USR2@S``;
            MAE's submitit scripts use 120).
        sbatch: further ``#SBATCH`` options of this cluster, ``{"gres": "gpu:8", "exclusive": True}``
            (submitit's ``slurm_additional_parameters``); setup: shell lines run before the command in the
            batch script, e.g. ``module load cuda`` (``slurm_setup``). Both are SLURM's only.
        submit_timeout_s: how long ``sbatch`` may take to answer before the submission is given up.
    """

    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int | None = None
    timeout_min: int = 60
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    executor: str = "slurm"
    folder: str | None = None
    max_timeouts: int = 10
    signal_delay_s: int = 90
    sbatch: dict = field(default_factory=dict)
    setup: list = field(default_factory=list)
    submit_timeout_s: float = 60.0

    @property
    def tasks(self) -> int:
        return self.tasks_per_node or max(self.gpus_per_node, 1)

    def check(self) -> None:
        """One line naming the first bad value and the fix (submitit missing included)."""
        import_submitit()
        if self.executor not in EXECUTORS:
            raise UserError(f"--executor {self.executor!r} is unknown; choose one of {', '.join(EXECUTORS)}")
        for flag, value, least in (("--nodes", self.nodes, 1), ("--gpus-per-node", self.gpus_per_node, 0),
                                   ("--tasks-per-node", self.tasks_per_node, 1), ("--timeout-min", self.timeout_min, 1),
                                   ("--cpus-per-task", self.cpus_per_task, 1), ("--max-timeouts", self.max_timeouts, 0)):
            if value is not None and value < least:
                raise UserError(f"{flag} must be an integer >= {least}, got {value}")
        if not 0 < self.signal_delay_s < self.timeout_min * 60:
            raise UserError(f"--signal-delay must be a number of seconds between 1 and the time limit "
                            f"({self.timeout_min * 60} s), got {self.signal_delay_s}")
        if not self.submit_timeout_s > 0:
            raise UserError(f"--submit-timeout must be a positive number of seconds, got {self.submit_timeout_s:g}")
        if clash := sorted(set(self.sbatch) & OWN_SBATCH):
            raise UserError(f"--sbatch {clash[0]}=... is set by submit itself; use --signal-delay (signal), or drop it")
        if self.mem_gb is not None and self.mem_gb <= 0:
            raise UserError(f"--mem-gb must be positive, got {self.mem_gb:g}")
        if self.executor == "local" and self.nodes != 1:
            raise UserError(f"--executor local runs on this machine: use --nodes 1 (got {self.nodes}), or submit to SLURM")
        if self.executor == "debug" and self.nodes * self.tasks != 1:
            raise UserError("--executor debug runs one process (this one); use --executor local for several tasks")
        if self.executor == "slurm" and not (shutil.which("sbatch") and shutil.which("srun")):
            raise UserError("no sbatch/srun on this machine: run resdecay submit on the cluster's login node, "
                            "or try the job here with --executor local")


# ----------------------------------------------------------------------------- inside the job
def job_environment():
    """submitit's description of the running job (SLURM, local or debug), or None outside a job."""
    submitit = import_submitit()
    try:
        return submitit.JobEnvironment()
    except RuntimeError:  # no executor's variables are set: a plain call (the debug executor's exception())
        return None


def torchrun_variables(env) -> dict[str, str]:
    """The variables ``torchrun`` would give this task, from a submitit ``JobEnvironment`` (as
    facebookresearch/mae's submitit_pretrain.py does); {} for a job of one task, which, like a plain
    ``resdecay pretrain``, needs none. Rank 0's host is the rendezvous; a job on one node uses the loopback
    address (its host name need not resolve). The port is derived from the job id, the same on every task
    and different for two jobs sharing a node; an exported MASTER_PORT wins."""
    if env is None or env.num_tasks <= 1:
        return {}
    digits = re.sub(r"\D", "", str(env.job_id)) or "0"
    return {"RANK": str(env.global_rank), "LOCAL_RANK": str(env.local_rank), "WORLD_SIZE": str(env.num_tasks),
            "LOCAL_WORLD_SIZE": str(env.num_tasks // max(env.num_nodes, 1)),
            "MASTER_ADDR": "127.0.0.1" if env.num_nodes == 1 else env.hostnames[0],
            "MASTER_PORT": os.environ.get("MASTER_PORT", str(20000 + int(digits[-9:]) % 20000))}


@contextmanager
def job_process(variables: dict[str, str], argv: list[str], cwd: str):
    """Run the block as ``resdecay ARGV`` started in ``cwd`` with ``variables`` exported; everything is
    put back afterwards (the debug executor runs the job inside the submitting process)."""
    saved_env = {k: os.environ.get(k) for k in variables}
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    os.environ.update(variables)
    sys.argv = ["resdecay", *argv]  # what the run lock records as the holder's command
    os.chdir(cwd)  # relative paths (train.out_dir=runs/x, data.path) mean what they meant at submission
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class SubmittedCommand:
    """The callable a job runs: ``entry(argv)`` (the CLI's ``main``) in every task. It is checkpointable
    in submitit's sense (submitit looks for a ``checkpoint`` method, as ``submitit.helpers.Checkpointable``
    provides): on the end-of-job signal rank 0 calls ``checkpoint()`` and the job is requeued with the same
    command, whose ``--resume auto`` continues from the run folder's newest checkpoint.

    Args:
        entry: ``argv -> exit code``, picklable by reference (``resdecay.cli.main.main``).
        argv: the command line after ``resdecay`` (``pretrain --preset ... --resume auto``).
        run_dir: the run folder, where ``slurm_jobs.jsonl`` is written; cwd: the submission's folder.
    """

    def __init__(self, entry: Callable[[list[str]], int], argv: list[str], run_dir: Path, cwd: str):
        self.entry, self.argv, self.run_dir, self.cwd = entry, list(argv), Path(run_dir), cwd

    @property
    def command(self) -> str:
        return next(a for a in self.argv if a in COMMANDS)

    def __call__(self) -> dict:
        env = job_environment()
        if env is None or env.global_rank == 0:
            job_id = None if env is None else env.job_id
            record(self.run_dir, "started", job_id=job_id, attempt=count_events(self.run_dir, "started", job_id),
                   hosts=list(env.hostnames) if env is not None else [socket.gethostname()],
                   tasks=env.num_tasks if env is not None else 1, pid=os.getpid())
        with job_process(torchrun_variables(env), self.argv, self.cwd):
            code = self.entry(list(self.argv))
        if code:
            raise SubmittedCommandFailed(self.command, code)
        return {"exit_code": 0, "run_dir": str(self.run_dir)}

    def checkpoint(self):
        """Called by submitit on rank 0 when the job is about to be preempted or to time out: note the
        requeue and hand back the same call (the training state is in the run folder's checkpoints)."""
        submitit = import_submitit()
        env = job_environment()
        newest = ckpt.list_checkpoints(self.run_dir / "checkpoints")
        record(self.run_dir, "requeued", job_id=None if env is None else env.job_id,
               resume_from=str(newest[-1]) if newest else None)
        return submitit.helpers.DelayedSubmission(self)


# ----------------------------------------------------------------------------- the run folder's job log
def record(run_dir: Path, event: str, **fields) -> None:
    """Append one event to ``<run>/slurm_jobs.jsonl``. One ``write`` of one line in append mode, so the
    submitting process and a job that starts at once (the local executor) cannot interleave."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"event": event, "time": time.strftime("%Y-%m-%d %H:%M:%S"), **fields}) + "\n"
    fd = os.open(run_dir / JOBS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_jobs(run_dir: Path) -> list[dict]:
    """The events of ``<run>/slurm_jobs.jsonl``, oldest first ([] when there is none)."""
    path = Path(run_dir) / JOBS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def count_events(run_dir: Path, event: str, job_id) -> int:
    return sum(1 for e in read_jobs(run_dir) if e["event"] == event and e.get("job_id") == job_id)


# ----------------------------------------------------------------------------- at submission
def run_folder(command: str, args) -> Path:
    """The run folder the command will write, resolved (and its config checked) before anything is queued:
    a typo in a preset or override fails now, not hours later when the job starts.

    Args:
        command: one of COMMANDS; args: the command's parsed arguments (its own argparse namespace).
    """
    if command in ("pretrain", "train-supervised"):
        return load_config(args.preset, args.overrides).out_dir
    if command == "finetune":
        source = args.source or args.checkpoint  # finetune --from FILE, or the positional checkpoint
        if source is None or not Path(source).exists():
            raise UserError(f"checkpoint {source} does not exist; give the pretraining checkpoint (or --from FILE) to fine-tune")
        source = Path(source)
        out = parse_overrides(args.overrides, "classifier").get("train", {}).get("out_dir")
        home = source if source.is_dir() else run_dir_of(source)  # as finetune.build_config places it
        return Path(out) if out else home / args.preset
    if args.list or not args.grid:
        raise UserError("submit ablate needs --grid (a shipped grid name or a YAML file); --list shows the shipped ones")
    return plan_grid(args.grid, args.out, args.only.split(",") if args.only else None, args.overrides).out_dir


def job_argv(command: str, argv: list[str], args, run_dir: Path) -> list[str]:
    """The command line every launch of the job runs: the user's, with ``--resume auto`` added so a requeued
    job continues (``ablate`` resumes every variant by itself). What would make a relaunch start over or
    resume elsewhere is refused in one line."""
    if command == "ablate":
        return list(argv)
    if getattr(args, "print_config", False):
        raise UserError("--print-config prints the config and exits: run it without submit")
    if args.overwrite:
        raise UserError(f"submit relaunches the command after a preemption, which must continue, not start over: "
                        f"instead of --overwrite delete {run_dir} first or choose another train.out_dir")
    if args.resume not in (None, "auto"):
        raise UserError(f"submit resumes with --resume auto (the newest checkpoint in {run_dir}); drop "
                        f"--resume {args.resume}, or copy that checkpoint into {run_dir / 'checkpoints'}")
    if args.resume is None:
        check_fresh_start(run_dir, None, False)  # a run already there is refused as `resdecay pretrain` would
        argv = [*argv, "--resume", "auto"]
    return list(argv)


def parse_sbatch_option(text: str) -> tuple[str, str | bool]:
    """``--sbatch comment=x`` / ``gres=gpu:8`` / ``exclusive`` (a flag) -> (key, value) for ``#SBATCH --key[=value]``."""
    key, eq, value = text.strip().lstrip("-").partition("=")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", key) or (eq and not value):
        raise UserError(f"--sbatch {text!r} is not an sbatch option; write it as NAME=VALUE or NAME, e.g. "
                        "--sbatch gres=gpu:8 --sbatch exclusive")
    return key.replace("-", "_"), value if eq else True


def submit(entry: Callable[[list[str]], int], argv: list[str], run_dir: Path, res: Resources):
    """Queue ``resdecay ARGV`` as a job and note it in ``<run>/slurm_jobs.jsonl``; returns submitit's Job.

    Args:
        entry: the CLI's ``main``; argv: the full command line after ``resdecay`` (see ``job_argv``);
        run_dir: the run folder it writes; res: what the job asks for and where it runs.
    """
    res.check()
    run_dir = Path(run_dir)
    folder = Path(res.folder) if res.folder else run_dir / "submitit"
    with removed_if_refused([folder, run_dir]), submission_files_removed_on_failure(folder):  # a failed one: no debris
        job = _queue(entry, argv, run_dir, res, folder)
    fields = {k: v for k, v in asdict(res).items() if v is not None and k not in ("folder", "tasks_per_node")}
    record(run_dir, "submitted", job_id=job.job_id, folder=str(folder.resolve()), cwd=os.getcwd(),
           command=shlex.join(["resdecay", *argv]), **fields, tasks_per_node=res.tasks)
    return job


def _queue(entry: Callable[[list[str]], int], argv: list[str], run_dir: Path, res: Resources, folder: Path):
    """submitit's Job of ``resdecay ARGV`` (``submit``'s arguments; ``folder``: submitit's), or one line on
    why sbatch did not take it."""
    check_writable(folder, "pass --folder DIR in a folder you can write" if res.folder else "choose a run folder you can write")
    check_writable(run_dir, "choose a run folder you can write")
    call = SubmittedCommand(entry, argv, run_dir.resolve(), os.getcwd())
    executor = make_executor(res, folder, f"resdecay-{call.command}-{run_dir.name}")
    try:
        return executor.submit(call)
    except Exception as e:  # sbatch refused (unknown partition, account, ...): its own message, on one line
        if getattr(e.__cause__, "returncode", None) in (124, 137):  # `timeout` stopped sbatch
            raise UserError(f"sbatch did not answer within {res.submit_timeout_s:g} s (is the SLURM controller up? "
                            "`squeue --me` shows whether a job was queued after all); try again later, or pass "
                            "--submit-timeout S") from None
        raise UserError(f"submission failed: {' '.join(str(e).split())[:400]}") from None


def wait_for_debug_job(job) -> None:
    """Run a debug-executor job here. Its ``exception()`` runs it without the post-mortem debugger that
    ``result()`` opens on a failure; a failed command has already printed its own error line."""
    with job_process({"SUBMITIT_DEBUG_JOB_ID": job.job_id}, sys.argv[1:], os.getcwd()):  # what result() exports
        error = job.exception()
    if isinstance(error, SubmittedCommandFailed):
        raise UserError(f"the submitted command failed with exit code {error.code} (its error is above)")
    if error is not None:
        raise error


def submit_command(res: Resources, command: str, job_args, argv: list[str], plugins: list[str],
                   entry: Callable[[list[str]], int]) -> None:
    """``resdecay submit``: the resources checked, the run folder named, the job submitted; a debug job
    runs here and is waited for.

    Args:
        res: the job's resources; command, job_args, argv: the submitted command, its parsed arguments
        and its argv; plugins: the ``--plugin`` files; entry: what every task of the job calls.
    """
    res.check()  # before the command's config is loaded: the cheap mistakes first
    run_dir = run_folder(command, job_args)
    plugins = [str(Path(p).resolve()) if Path(p).exists() else p for p in plugins]  # the job may start elsewhere
    argv = [*(x for p in plugins for x in ("--plugin", p)), *job_argv(command, argv, job_args, run_dir)]
    job = submit(entry, argv, run_dir, res)
    print(f"submitted job {job.job_id} ({res.executor}, {res.nodes} node(s) x {res.tasks} task(s)): resdecay {' '.join(argv)}")
    if res.executor == "debug":  # runs now, here, printing to this terminal
        wait_for_debug_job(job)
        return
    print(f"logs: {job.paths.stdout}; job history: {run_dir / JOBS_FILE}")
