"""``resdecay submit [job options] pretrain|finetune|ablate|train-supervised ...``: the command as a SLURM job
through submitit, requeued on preemption or timeout (commands/submit.py; docs/cluster.md)."""

from __future__ import annotations

import argparse
from contextlib import contextmanager

from ..commands.submit import COMMANDS, EXECUTORS, Resources, parse_sbatch_option, submit_command
from ..errors import UserError
from .parents import run_overrides


@contextmanager
def one_line_errors(parser: argparse.ArgumentParser, command: str):
    """The command's own parser, its usage errors raised as a UserError (one line, exit 2) instead of
    argparse's usage text and exit."""
    def refuse(message: str):
        raise UserError(f"submit {command}: {message}")

    parser.error = refuse
    try:
        yield parser
    finally:
        del parser.error  # back to the class's method


def parse_job(parsers: dict, job: list[str]) -> tuple[str, argparse.Namespace, list[str]]:
    """The submitted command's name, its parsed arguments and its argv (key=value overrides after options
    are kept, as ``resdecay`` itself allows)."""
    if not job:
        raise UserError(f"submit needs a command to run: one of {', '.join(COMMANDS)}")
    command, rest = job[0], job[1:]
    if command not in COMMANDS:
        raise UserError(f"submit runs {', '.join(COMMANDS)}; got {command!r} (submit options go before the command)")
    with one_line_errors(parsers[command], command) as parser:
        args, extra = parser.parse_known_args(rest)
        if extra and not (hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra)):
            raise UserError(f"submit {command}: unrecognized arguments: {' '.join(extra)}")
    args.overrides = [*getattr(args, "overrides", []), *extra]
    if command != "ablate":  # --out names the run folder (ablate's --out is its grid folder, read as such)
        args.overrides = run_overrides(args)
    return command, args, [command, *rest]


def cmd_submit(args, parsers: dict, entry) -> None:
    res = Resources(nodes=args.nodes, gpus_per_node=args.gpus_per_node, tasks_per_node=args.tasks_per_node,
                    timeout_min=args.timeout_min, partition=args.partition, account=args.account, qos=args.qos,
                    constraint=args.constraint, cpus_per_task=args.cpus_per_task, mem_gb=args.mem_gb,
                    executor=args.executor, folder=args.folder, max_timeouts=args.max_timeouts,
                    signal_delay_s=args.signal_delay, sbatch=dict(parse_sbatch_option(o) for o in args.sbatch),
                    setup=list(args.setup), submit_timeout_s=args.submit_timeout)
    command, job_args, argv = parse_job(parsers, args.job)
    submit_command(res, command, job_args, argv, args.plugin, entry)


def add_submit_command(sub, entry) -> None:
    """Register ``submit``. ``entry`` is the CLI's ``main``: what every task of the job calls."""
    s = sub.add_parser("submit", help="run pretrain / finetune / ablate / train-supervised as a SLURM job (submitit), "
                                      "requeued with --resume auto on preemption or timeout (docs/cluster.md)")
    s.add_argument("--nodes", type=int, default=1, help="machines (default 1)")
    s.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per machine (default 0: CPU nodes)")
    s.add_argument("--tasks-per-node", type=int, default=None,
                   help="processes per machine (default one per GPU, as torchrun --nproc_per_node; 1 without GPUs)")
    s.add_argument("--timeout-min", type=int, required=True, help="time limit of one job, minutes; at its end the job is requeued")
    s.add_argument("--partition", default=None, help="SLURM partition (default: the cluster's)")
    s.add_argument("--account", default=None, help="SLURM account")
    s.add_argument("--qos", default=None, help="SLURM quality of service")
    s.add_argument("--constraint", default=None, help="SLURM node constraint (e.g. a100)")
    s.add_argument("--cpus-per-task", type=int, default=None, help="CPU cores per process (data loading workers)")
    s.add_argument("--mem-gb", type=float, default=None, help="memory per node, GB")
    s.add_argument("--max-timeouts", type=int, default=10,
                   help="requeues after hitting --timeout-min before the job gives up (default 10; preemptions are not counted)")
    s.add_argument("--executor", default="slurm", help=f"{' | '.join(EXECUTORS)}: local runs the job in subprocesses on "
                                                         "this machine, debug in this process (both without a cluster)")
    s.add_argument("--folder", default=None, help="submitit's folder: job pickles and logs (default <run>/submitit)")
    s.add_argument("--signal-delay", type=int, default=90, metavar="S",
                   help="SLURM signals the job S seconds before its time limit to checkpoint and requeue (default 90; MAE uses 120)")
    s.add_argument("--sbatch", action="append", default=[], metavar="NAME[=VALUE]",
                   help="a further #SBATCH option of your cluster, repeatable: --sbatch gres=gpu:8 --sbatch exclusive "
                        "--sbatch comment=mae (SLURM only)")
    s.add_argument("--setup", action="append", default=[], metavar="LINE",
                   help="a shell line run before the command in the batch script, repeatable: --setup 'module load cuda/12.1' "
                        "(SLURM only)")
    s.add_argument("--submit-timeout", type=float, default=60, metavar="S",
                   help="give up when sbatch has not answered after S seconds (default 60)")
    s.add_argument("job", nargs=argparse.REMAINDER, metavar="COMMAND ...",
                   help=f"{' | '.join(COMMANDS)} with its own options, e.g. pretrain --preset mae-b16 data.path=/data/in100")
    s.set_defaults(func=lambda args: cmd_submit(args, sub.choices, entry))
