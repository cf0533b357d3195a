"""What the tracker tests share: a short tiny run, and trackers that never leave the machine."""

from __future__ import annotations

import pytest

from helpers import TINY

# 640 images in batches of 64: 10 steps, a row every 2, checkpoints at 4, 8 and 10
RUN = [*TINY, "train.epochs=1", "data.train_subset=640", "train.threads=1", "train.log_every=2", "train.ckpt_every=4",
       "train.keep_last=10"]
ONLINE = ["train.online_eval_every=1", "train.online_eval_size=100"]
EVAL = dict(evals=("knn",), max_train=200, max_test=100, baselines=False, progress=False)
OFFLINE = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off", "WANDB_DISABLE_GIT": "true",
           "MLFLOW_ALLOW_FILE_STORE": "true"}
NOT_SET = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_GROUP", "WANDB_RUN_ID")


def offline(mp: pytest.MonkeyPatch) -> None:
    """Nothing leaves the machine: W&B offline, MLflow in the run folder."""
    for k, v in OFFLINE.items():
        mp.setenv(k, v)
    for k in NOT_SET:
        mp.delenv(k, raising=False)


def needs(package: str):
    """The optional package (both are in the test extra); the test skips only where it is not installed."""
    return pytest.importorskip(package, reason=f"pip install -e '.[{package.split('.')[0]}]' (in the test extra)")
