"""Hooks: what a caller adds to a training run without the loop knowing what it is, such as online
evaluation (``eval.online_hook.OnlineEvaluation``), figures for the experiment trackers
(``viz.online_figures.OnlineFigures``) or a fine-tuning run's test accuracy. ``train(cfg, hooks=[...])``
calls every hook, in order, on every rank:

- ``start(cfg, device)`` once per launch, after the network is built and seeded and before the first
  step. Whatever a hook builds there may draw from the seeded RNG; it does so at the same point of
  every run, so runs stay repeatable.
- ``epoch_end(model, epoch, step, log)`` after every epoch, on a forked RNG (evaluation never shifts
  the training stream) and before the epoch's last checkpoint, so a run killed inside a hook resumes
  from the checkpoint before and runs the hook again. ``model`` is the EMA weights when the run keeps
  them (the weights one samples with), else the bare network; ``log`` is the run's ``RunLog``.

A plain function ``f(model, epoch, step, log)`` is an epoch-end hook.
"""

from __future__ import annotations

from typing import Callable, Iterable, Union

import torch


class Hook:
    """Something the loop calls at fixed points of a run; override what you need."""

    def start(self, cfg, device: torch.device) -> None:
        """Once per launch, before the first step (``cfg``: the RunConfig; ``device``: this rank's)."""

    def epoch_end(self, model: torch.nn.Module, epoch: int, step: int, log) -> None:
        """After epoch ``epoch`` (0-based), which ended at optimizer step ``step``."""


class EpochEnd(Hook):
    """A plain function ``f(model, epoch, step, log)`` as a hook."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def epoch_end(self, model, epoch, step, log) -> None:
        self.fn(model, epoch, step, log)


HookLike = Union[Hook, Callable]


def as_hooks(hooks: Iterable[HookLike | None]) -> list[Hook]:
    """``hooks`` with every plain function wrapped as an ``EpochEnd`` (None, an optional hook left out, is dropped)."""
    return [h if isinstance(h, Hook) else EpochEnd(h) for h in hooks if h is not None]


def is_eval_epoch(epoch: int, tc) -> bool:
    """Whether online evaluation runs after ``epoch`` (0-based): every ``train.online_eval_every``
    epochs and after the last one, never when it is 0 (``tc``: the run's TrainConfig)."""
    done = epoch + 1
    return tc.online_eval_every > 0 and (done % tc.online_eval_every == 0 or done == tc.epochs)
