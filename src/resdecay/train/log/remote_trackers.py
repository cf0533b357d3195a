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

A resumed launch never logs a step twice (a curve with two values at one step is not a curve). Neither service can delete a point, so the
points a killed launch logged past its checkpoint stay, and the resumed launch logs a tag only at steps
beyond the last one the run already holds for it: MLflow's own metric history says which; for W&B
(whose offline files cannot be read back cheaply) each launch keeps ``<run>/wandb/resdecay-steps-<id>.json``,
the last step logged per tag. ``log.jsonl``, TensorBoard and CSV hold the resumed launch's values for
those steps instead; with exact resume the two agree.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlparse

import yaml

from ...errors import UserError, one_line
from ...io import atomic_write_text
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

        resume, timeout = resume or {}, wandb_timeout()
        try:
            self.run = wandb.init(dir=str(run_dir), id=resume.get("id"), project=resume.get("project") or
                                  os.environ.get("WANDB_PROJECT") or PROJECT, entity=resume.get("entity") or None,
                                  name=self.run_name(run_dir), group=self.group.name if self.group else None,
                                  config=config, allow_val_change=True, resume="allow" if resume.get("id") else None,
                                  settings=wandb.Settings(init_timeout=timeout))
        except Exception as e:  # not logged in, no network, no answer, a bad setting: one line, before training
            raise TrackerStartError(f"Weights & Biases could not start a run within {timeout:g} s ({type(e).__name__}: "
                                    f"{one_line(e)}); run `wandb login`, check WANDB_BASE_URL, or set WANDB_MODE=offline "
                                    "to log locally (WANDB_INIT_TIMEOUT: seconds to wait), or drop wandb from "
                                    "train.loggers") from None
        self.steps_file = Path(run_dir) / "wandb" / f"resdecay-steps-{self.run.id}.json"
        self.logged = read_steps(self.steps_file) if resume_step is not None else {}
        # online, a resumed run starts past the server's last step (W&B would drop earlier points with a warning)
        self.floor = self.run.step - 1 if resume_step is not None else -1
        return {"id": self.run.id, "project": self.run.project, "entity": self.run.entity or ""}

    def _new(self, step: int, values: dict) -> dict:
        """The values at ``step`` not logged to this run yet, noted as logged (in the steps file)."""
        fresh = {k: v for k, v in values.items() if step > max(self.logged.get(k, -1), self.floor)}
        if fresh:
            self.logged.update({k: step for k in fresh})
            atomic_write_text(self.steps_file, json.dumps(self.logged))
        return fresh

    def log_scalars(self, step, values):
        if fresh := self._new(step, values):
            self.run.log(fresh, step=step)

    def log_text(self, step, name, text):
        import wandb

        if self._new(step, {name: 0}):
            self.run.log({name: wandb.Html(f"<pre>{html.escape(text)}</pre>")}, step=step)

    def log_image(self, step, name, image):
        import wandb

        if self._new(step, {name: 0}):
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
        check_reachable(uri)
        experiment = resume.get("experiment") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or (
            self.group.name if self.group else PROJECT)
        timeout = connect_timeout()  # a bad $MLFLOW_HTTP_REQUEST_TIMEOUT is its own line, not "check the URI"
        try:
            with bounded_mlflow_requests(timeout):
                self.client = MlflowClient(tracking_uri=uri)
                self.run_id = self._find_run(resume.get("id")) or self._new_run(experiment, self.run_name(run_dir))
                if config is not None:
                    self._log_params(config)
                self.held = self._held_steps() if resume_step is not None else {}
                if resume_step is None and config is not None:
                    self.client.log_text(self.run_id, yaml.safe_dump(config, sort_keys=False), "config.yaml")
        except Exception as e:
            raise TrackerStartError(f"MLflow could not start a run at {uri} ({type(e).__name__}: {one_line(e)}); check "
                                    "MLFLOW_TRACKING_URI, or drop mlflow from train.loggers") from None
        self.last_held = max(self.held.values(), default=-1)
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

    def _held_steps(self) -> dict[str, int]:
        """The last step the run holds per metric: a resumed launch logs a metric only past it, since
        MLflow cannot delete the points a killed launch logged after its checkpoint."""
        keys = self.client.get_run(self.run_id).data.metrics
        return {k: max((m.step for m in self.client.get_metric_history(self.run_id, k)), default=-1) for k in keys}

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
        metrics = [Metric(k, float(v), now, step) for k, v in values.items() if step > self.held.get(k, -1)]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)
            self.held.update({m.key: step for m in metrics})  # a tag twice at one step (epoch in two rows) once

    def log_text(self, step, name, text):
        self.client.log_text(self.run_id, text, f"{name}.txt")

    def log_image(self, step, name, image):
        if step > self.last_held:  # a killed launch's figures past the checkpoint stay, as its points do
            self.client.log_image(self.run_id, image_array(image), key=name, step=step)

    def log_summary(self, values, step=None):
        self.log_scalars(step or 0, values)

    def finish(self, ok=True):
        self.client.set_terminated(self.run_id, status="FINISHED" if ok else "FAILED")


def read_steps(path: Path) -> dict[str, int]:
    """A W&B steps file (tag -> last step logged); {} when there is none or it cannot be read."""
    try:
        found = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in found.items() if isinstance(v, int)} if isinstance(found, dict) else {}


def seconds_setting(name: str, default: float) -> float:
    """A timeout from the environment (``$name``, else ``default``), or one line when it is not a positive
    number of seconds."""
    text = os.environ.get(name)
    try:
        value = float(text) if text is not None else default
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise TrackerStartError(f"{name}={text!r} is not a number of seconds; set it to e.g. 10") from None
    return value


def connect_timeout() -> float:
    """Seconds to wait for an MLflow tracking server: ``$MLFLOW_HTTP_REQUEST_TIMEOUT`` (MLflow's own setting),
    else 10. MLflow itself retries a refused or unanswered request with back-off for minutes, silently."""
    return max(seconds_setting("MLFLOW_HTTP_REQUEST_TIMEOUT", 10), 0.1)


def wandb_timeout() -> float:
    """Seconds ``wandb.init`` may take: ``$WANDB_INIT_TIMEOUT`` (W&B's own setting), else W&B's 90."""
    return seconds_setting("WANDB_INIT_TIMEOUT", 90)


def check_reachable(uri: str) -> None:
    """One line, within about ``connect_timeout()`` seconds, when an http(s) tracking server does not accept
    a connection, or accepts it and does not answer a request (before training starts, instead of minutes
    of MLflow's silent retries)."""
    parsed = urlparse(uri)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    timeout, start = connect_timeout(), time.monotonic()
    where = f"MLflow tracking server {parsed.hostname}:{port} ({uri})"
    fix = "start it or fix MLFLOW_TRACKING_URI, or drop mlflow from train.loggers"
    try:
        conn = socket.create_connection((parsed.hostname, port), timeout=timeout)
    except OSError as e:
        reason = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise TrackerStartError(f"{where} is not reachable ({reason}, waited up to {timeout:g} s); {fix}") from None
    try:
        problem = http_silence(conn, parsed, max(timeout - (time.monotonic() - start), 0.1))
    finally:
        conn.close()
    if problem:
        raise TrackerStartError(f"{where} {problem} (waited up to {timeout:g} s); {fix}")


def http_silence(conn: socket.socket, parsed, timeout: float) -> str | None:
    """Why a connected server is not an HTTP server that answers (None when it answers): one request for
    ``<path>/health`` (any status counts), the first byte of the answer awaited at most ``timeout`` s."""
    import ssl

    try:
        conn.settimeout(timeout)
        if parsed.scheme == "https":  # only whether it answers is asked here; MLflow checks the certificate
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            conn = context.wrap_socket(conn, server_hostname=parsed.hostname)
        path = (parsed.path.rstrip("/") or "") + "/health"
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nConnection: close\r\n\r\n".encode())
        if not conn.recv(1):
            return "accepted the connection and closed it without an answer"
    except TimeoutError:
        return "accepted the connection but did not answer a request"
    except ssl.SSLError as e:
        return f"did not complete a TLS handshake ({e.reason or type(e).__name__}: is it an http:// server?)"
    except OSError as e:
        return f"dropped the connection ({e.strerror or type(e).__name__})"
    finally:
        conn.close()  # the TLS socket, when one was wrapped around it
    return None


@contextlib.contextmanager
def bounded_mlflow_requests(timeout: float):
    """MLflow's own requests while a run starts (MLflow's defaults: 120 s each, 7 retries with back-off)
    bounded by the same timeout and 2 retries, where the user set neither; the user's settings win."""
    bounds = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(math.ceil(timeout), 1)), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
    added = [name for name in bounds if name not in os.environ]
    os.environ.update({name: bounds[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


class TrackerStartError(UserError):
    """A tracker that could not open its run: the CLI's one-line error (exit 2), before training."""
