"""The submitit plumbing of ``resdecay submit`` (commands/submit.py): the optional package itself, the executor a
job is queued with, and what a failed submission leaves in submitit's folder."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

from ..errors import UserError

INSTALL_HINT = "pip install -e '.[slurm]'"


def import_submitit():
    """The optional ``submitit`` package, or one line naming the extra that installs it."""
    try:
        import submitit
    except ImportError:
        raise UserError(f"resdecay submit needs the optional package submitit: {INSTALL_HINT}") from None
    return submitit


def make_executor(res, folder: Path, name: str):
    """A submitit executor for ``res`` (a ``submit.Resources``; ``AutoExecutor``: the generic options are
    translated per cluster, the ``slurm_`` ones are ignored by the local and debug executors)."""
    submitit = import_submitit()
    limit = {f"{res.executor}_max_num_timeout": res.max_timeouts} if res.executor != "debug" else {}
    executor = submitit.AutoExecutor(folder=folder, cluster=res.executor, **limit)
    executor.update_parameters(name=name, nodes=res.nodes, tasks_per_node=res.tasks, gpus_per_node=res.gpus_per_node,
                               timeout_min=res.timeout_min, cpus_per_task=res.cpus_per_task, mem_gb=res.mem_gb,
                               slurm_partition=res.partition, slurm_account=res.account, slurm_qos=res.qos,
                               slurm_constraint=res.constraint, slurm_signal_delay_s=res.signal_delay_s,
                               slurm_setup=list(res.setup) or None,
                               # requeueable also where the cluster's default is not (PreemptMode=REQUEUE needs it)
                               slurm_additional_parameters={"requeue": True, **res.sbatch})
    if res.executor == "slurm" and shutil.which("timeout"):
        # submitit waits for sbatch without a limit: a hung controller would hang submit silently
        slurm = executor._executor
        plain = slurm._make_submission_command
        slurm._make_submission_command = lambda path: ["timeout", "--kill-after=5", f"{res.submit_timeout_s:g}", *plain(path)]
    return executor


@contextmanager
def submission_files_removed_on_failure(folder: Path):
    """What submitit writes before it calls sbatch (the pickled command ``<uuid>.pkl`` and the batch file
    ``.submission_file_<uuid>.sh``, which it renames after the job id once sbatch answers) is removed when the
    submission fails in any way (refused, timed out, interrupted): no job will ever read it."""
    import_submitit()  # one line where it is missing
    from submitit.core.utils import JobPaths

    where = JobPaths.get_first_id_independent_folder(folder)  # where submitit puts them (a %j folder's parent)
    before = set(where.iterdir()) if where.is_dir() else set()
    try:
        yield
    except BaseException:
        for path in (set(where.iterdir()) - before) if where.is_dir() else ():
            if path.suffix == ".pkl" or path.name.startswith(".submission_file_"):
                path.unlink(missing_ok=True)
        raise
