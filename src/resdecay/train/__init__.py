"""Training: the typed run config, the step loop and its setup, the lr schedule, the optimizer,
checkpoints, the process environment (one code path for CPU, one GPU and torchrun) and the run log.

``from resdecay.train import train`` is the one training loop; the commands that train pass it the
online evaluators (``resdecay.commands.pretrain.train_with_online_eval``), since this layer does not
import ``eval/``.
"""

from .config import RunConfig, TrainConfig, load_config
from .loop import train
from .lr_sched import lr_at
from .optim import param_groups

__all__ = ["RunConfig", "TrainConfig", "load_config", "lr_at", "param_groups", "train"]
