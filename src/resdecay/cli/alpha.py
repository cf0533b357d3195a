"""``resdecay alpha``'s parser: print and plot an alpha schedule, solve alpha_min for a target
alpha_eff, or (``--shortcut NAME``) print a registered shortcut formula's table, a plugin's included.
The command itself is ``commands/alpha.py``."""

from __future__ import annotations

from ..commands.alpha import run_alpha
from ..schedule import SCHEDULES


def add_alpha_command(sub) -> None:
    a = sub.add_parser("alpha", help="print and plot an alpha schedule, solve alpha_min for a target alpha_eff, "
                                     "or print a shortcut formula's table (--shortcut)")
    a.add_argument("--depth", type=int, required=True, help="number of transformer blocks")
    a.add_argument("--alpha-min", type=float, default=None, help="alpha of the last sub-block")
    a.add_argument("--target-eff", type=float, default=None, help="solve for the alpha_min giving this alpha_eff")
    a.add_argument("--schedule", default="linear", choices=SCHEDULES, help="linear (authors' code) | paper (eq. 5) | cosine | constant")
    a.add_argument("--shortcut", default=None, metavar="NAME",
                   help="a registered shortcut formula (model.shortcut: decay, learnable, scaled_sum, scaled_branch or a "
                        "--plugin's): print its alphas and betas")
    a.add_argument("--out", default=None, help="PNG path (default runs/alpha/alpha_d<depth>_<alpha_min>_<schedule>.png)")
    a.add_argument("--json", action="store_true", help="print JSON instead of the table")
    a.set_defaults(func=lambda args: run_alpha(args.depth, args.alpha_min, args.target_eff, args.schedule, args.shortcut,
                                               args.out, args.json))
