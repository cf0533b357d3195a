"""The Weights & Biases and MLflow back ends of ``trackers.Tracker`` (optional extras:
``pip install -e '.[wandb]'`` / ``'.[mlflow]'``; imported only when a run chooses them).

Where their runs go, and how a resumed launch finds its run again:

- W&B: files under ``<run>/wandb/``; project ``$WANDB_PROJECT`` (else ``resdecay``), entity and
  mode from W&B's own settings (``wandb login``, ``WANDB_MODE=offline`` keeps everything local),
  run name = the run folder's name, group = the ablation grid's name under ``resdecay ablate``.
  The checkpoint keeps the run id, project and entity; a resumed launch continues that run.
- MLflow: tracking URI ``$MLFLOW_TRACKING_URI``, else a file store beside the run
  (``file:<run>/mlruns``; under ``resdecay ablate``, one store for the whole grid,
  ``file:<grid>/mlruns``); experiment ``$MLFLOW_EXPERIMENT_NAME``, else the grid's name, else
  ``resdecay``. The config goes in as parameters (``train.epochs``) and as ``config.yaml``. The
  checkpoint keeps the run id, the URI and the experiment.
"""

from __future__ import annotations

import html
import os
import time
from pathlib import Path

import yaml

from ..errors import UserError, one_line
from .trackers import Tracker, image_array

PROJECT = "resdecay"  # default W&B project and MLflow experiment


def flat_config(config: dict, prefix: str = "") -> dict[str, str]:
    """``{"train": {"epochs": 5}}`` -> ``{"train.epochs": "5"}``: MLflow parameters."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:500]
    return out


class WandbTracker(Tracker):
    """A W&B run (``wandb.init``); steps are the optimizer steps."""

    name = "wandb"

    def start(self, config, run_dir, resume=None, resume_step=None):
        import wandb

        resume = resume or {}
        try:
            self.run = wandb.init(dir=str(run_dir), id=resume.get("id"), project=resume.get("project") or
                                  os.environ.get("WANDB_PROJECT") or PROJECT, entity=resume.get("entity") or None,
                                  name=self.run_name(run_dir), group=self.group.name if self.group else None,
                                  config=config, allow_val_change=True, resume="allow" if resume.get("id") else None)
        except Exception as e:  # not logged in, no network, a bad setting: one line, before training
            raise TrackerStartError(f"Weights & Biases could not start a run ({type(e).__name__}: {one_line(e)}); run `wandb login`, "
                                    "or set WANDB_MODE=offline to log locally, or drop wandb from train.loggers") from None
        return {"id": self.run.id, "project": self.run.project, "entity": self.run.entity or ""}

    def log_scalars(self, step, values):
        self.run.log(dict(values), step=step)

    def log_text(self, step, name, text):
        import wandb

        self.run.log({name: wandb.Html(f"<pre>{html.escape(text)}</pre>")}, step=step)

    def log_image(self, step, name, image):
        import wandb

        self.run.log({name: wandb.Image(image_array(image))}, step=step)

    def log_summary(self, values, step=None):
        self.run.summary.update(dict(values))

    def finish(self, ok=True):
        self.run.finish(exit_code=0 if ok else 1)


class MlflowTracker(Tracker):
    """An MLflow run, written through ``MlflowClient`` with its run id (no global active run, so
    several runs in one process, as in ``resdecay ablate``, never mix)."""

    name = "mlflow"

    def start(self, config, run_dir, resume=None, resume_step=None):
        from mlflow.tracking import MlflowClient

        resume = resume or {}
        uri = self.tracking_uri(Path(run_dir), resume.get("uri"))
        if uri.startswith("file:"):  # MLflow 3.x asks for this opt-in to keep using a file store
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        experiment = resume.get("experiment") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or (
            self.group.name if self.group else PROJECT)
        try:
            self.client = MlflowClient(tracking_uri=uri)
            self.run_id = self._find_run(resume.get("id")) or self._new_run(experiment, self.run_name(run_dir))
            if config is not None:
                self._log_params(config)
        except Exception as e:
            raise TrackerStartError(f"MLflow could not start a run at {uri} ({type(e).__name__}: {one_line(e)}); check "
                                    "MLFLOW_TRACKING_URI, or drop mlflow from train.loggers") from None
        if resume_step is None and config is not None:
            self.client.log_text(self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")
        return {"id": self.run_id, "uri": uri, "experiment": experiment}

    def tracking_uri(self, run_dir: Path, saved: str | None) -> str:
        """The resumed run's store (unless it was a file store that is gone: a moved run folder),
        else $MLFLOW_TRACKING_URI, else a file store in the grid's or the run's folder."""
        if saved and not (saved.startswith("file:") and not Path(saved[5:]).exists()):
            return saved
        folder = self.group.folder if self.group else run_dir
        return os.environ.get("MLFLOW_TRACKING_URI") or f"file:{(Path(folder) / 'mlruns').resolve()}"

    def _find_run(self, run_id: str | None) -> str | None:
        """The resumed run, set running again; None when there is none (or it is not in this store)."""
        if not run_id:
            return None
        try:
            self.client.get_run(run_id)
        except Exception:  # deleted, or the store moved: a new run, said in one line
            print(f"note: MLflow run {run_id} was not found in {self.client.tracking_uri}; starting a new one")
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def _new_run(self, experiment: str, run_name: str) -> str:
        found = self.client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        return self.client.create_run(experiment_id, run_name=run_name).info.run_id

    def _log_params(self, config: dict) -> None:
        """The config as parameters; a resumed run adds only new keys (MLflow never changes a parameter)."""
        from mlflow.entities import Param

        have = self.client.get_run(self.run_id).data.params
        params = [Param(k, v) for k, v in flat_config(config).items() if k not in have]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_scalars(self, step, values):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    def log_text(self, step, name, text):
        self.client.log_text(self.run_id, text, f"{name}.txt")

    def log_image(self, step, name, image):
        self.client.log_image(self.run_id, image_array(image), key=name, step=step)

    def log_summary(self, values, step=None):
        self.log_scalars(step or 0, values)

    def finish(self, ok=True):
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")


class TrackerStartError(UserError):
    """A tracker that could not open its run: the CLI's one-line error (exit 2), before training."""
