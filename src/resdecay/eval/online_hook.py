"""``train.online_eval_every`` as a training hook: the online evaluators of ``eval.online`` (kNN,
probe and effective rank for encoders; proxy FID and probe grid for the diffusion families), built
when a launch starts and run after every epoch they are due (``train.hooks``)."""

from __future__ import annotations

import torch

from ..train.hooks import Hook
from .online import online_evaluator


class OnlineEvaluation(Hook):
    """The online evaluation a run's ``train.online_eval_every`` asks for (nothing when it is 0)."""

    def __init__(self):
        self.evaluate = None

    def start(self, cfg, device: torch.device) -> None:
        # built at the hook's start, after the network is seeded: it may draw from that RNG
        self.evaluate = online_evaluator(cfg, device) if cfg.train.online_eval_every > 0 else None

    def epoch_end(self, model, epoch: int, step: int, log) -> None:
        if self.evaluate is not None:  # the evaluator itself skips the epochs it is not due
            self.evaluate(model, epoch, step, log)
