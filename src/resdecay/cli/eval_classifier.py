"""``resdecay eval-classifier``'s parser (the command is ``commands/eval_classifier.py``)."""

from __future__ import annotations

from ..commands.eval_classifier import run_eval_classifier


def add_eval_classifier_command(sub, parents) -> None:
    """``resdecay eval-classifier``; ``parents``: the CLI's shared data, device and progress options."""
    ec = sub.add_parser("eval-classifier", parents=parents,
                        help="top-1 / top-5 of a fine-tuned or probed classifier (resdecay finetune's checkpoints)")
    ec.add_argument("checkpoint", help="a classifier checkpoint: <run>/checkpoints/best.pt or a step_*.pt")
    ec.add_argument("--split", default="test", choices=("test", "train"), help="the split to measure (default test)")
    ec.add_argument("--num-workers", type=int, default=0, help="data loading workers (default 0)")
    ec.add_argument("--out", default=None, help="JSON report (default <run>/eval/classifier_<checkpoint>_<split>.json)")
    ec.set_defaults(func=lambda a: run_eval_classifier(a.checkpoint, a.split, a.data, a.data_path, a.device, a.num_workers,
                                                       a.out, not a.no_progress))
