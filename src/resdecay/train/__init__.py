"""Training: the typed run config, the step loop and its setup, checkpoints, the process
environment (one code path for CPU, one GPU and torchrun) and the run log.

``from resdecay.train import train`` is the loop; ``resdecay.commands.pretrain.train`` is the same
loop with the online evaluators attached (what ``resdecay pretrain`` runs).
"""

from .config import RunConfig, TrainConfig, load_config
from .loop import train
from .setup import lr_at, param_groups

__all__ = ["RunConfig", "TrainConfig", "load_config", "lr_at", "param_groups", "train"]
