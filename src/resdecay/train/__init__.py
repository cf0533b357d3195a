"""Training: the typed run config, the step loop and its setup, the lr schedule, the optimizer,
checkpoints and the process environment (one code path for CPU, one GPU and torchrun); the run
folder's housekeeping in ``run/``, the log and the experiment trackers in ``log/``.

``from resdecay.train import train`` is the one training loop: ``train(cfg, hooks=[...])``. What it
does not know about comes in as hooks (``hooks.Hook``): the commands that train pass the online
evaluation and its figures (``resdecay.viz.online_figures.online_hooks()``), since this layer does
not import ``eval/``.
"""

from .config import RunConfig, TrainConfig, load_config
from .hooks import Hook
from .loop import train
from .lr_sched import lr_at
from .optim import param_groups

__all__ = ["Hook", "RunConfig", "TrainConfig", "load_config", "lr_at", "param_groups", "train"]
