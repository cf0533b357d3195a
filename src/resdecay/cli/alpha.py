"""``resdecay alpha``: print and plot an alpha schedule, solve alpha_min for a target alpha_eff, or
(``--shortcut NAME``) print a registered shortcut formula's table, a plugin's included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UserError
from ..nn.residual import check_shortcut, shortcut_plan
from ..nn.shortcut_info import describe_shortcut, ignored_knobs, knob_warnings
from ..schedule import SCHEDULES, alpha_schedule, effective_decay, solve_alpha_min
from ..viz.plots import plot_alpha_schedules


def _alpha_min(args, note) -> float:
    """--alpha-min, or the one --target-eff solves for; with --shortcut a formula that ignores
    alpha_min needs neither."""
    if args.shortcut is not None and args.alpha_min is None and args.target_eff is None:
        if "alpha_min" in ignored_knobs(args.shortcut):
            return 1.0
        raise UserError(f"--shortcut {args.shortcut} reads alpha_min: give --alpha-min (e.g. --alpha-min 0.6)")
    if (args.alpha_min is None) == (args.target_eff is None):
        raise UserError("give exactly one of --alpha-min (to see its schedule) or --target-eff (to solve for alpha_min)")
    if args.target_eff is None:
        return args.alpha_min
    if args.shortcut not in (None, "decay"):
        raise UserError(f"--target-eff solves the decay schedule's alpha_min; with --shortcut {args.shortcut} "
                        "give --alpha-min instead")
    alpha_min = solve_alpha_min(args.depth, args.target_eff, args.schedule)
    print(f"alpha_min {alpha_min:.6f} gives alpha_eff {args.target_eff:.3g} at depth {args.depth} ({args.schedule} schedule)",
          file=note)
    return alpha_min


def cmd_alpha(args) -> None:
    # with --json, stdout carries the JSON document alone; every message goes to stderr
    note = sys.stderr if args.json else sys.stdout
    try:
        if args.shortcut is not None:
            check_shortcut(args.shortcut, keys=("--shortcut", "--decay-branches"))
        alpha_min = _alpha_min(args, note)
        if args.shortcut is None:
            a, b = alpha_schedule(args.depth, alpha_min, args.schedule), None
        else:
            plan = shortcut_plan(args.depth, alpha_min, args.schedule, shortcut=args.shortcut)
            a, b = plan.alphas, plan.betas
    except ValueError as e:  # ConfigError included
        raise UserError(str(e)) from None
    if args.shortcut is not None:
        for line in knob_warnings(args.shortcut, alpha_min, args.schedule, keys=("--shortcut", "--alpha-min", "--schedule")):
            print(line, file=sys.stderr)
    eff = effective_decay(a)
    label = describe_shortcut(args.shortcut or "decay", alpha_min, args.schedule)
    if args.json:
        doc = {"depth": args.depth, "alpha_min": alpha_min, "schedule": args.schedule, "alpha_eff": eff, "alphas": a.tolist()}
        if b is not None:
            doc.update(shortcut=args.shortcut, label=label, betas=b.tolist())
        print(json.dumps(doc))
    else:
        _print_table(args, a, b, eff, alpha_min, label)
    suffix = f"_{args.shortcut}" if args.shortcut else ""
    out = Path(args.out or f"runs/alpha/alpha_d{args.depth}_{alpha_min:.3f}_{args.schedule}{suffix}.png")
    title = label if args.shortcut else f"alpha_min {alpha_min:.3g} ({args.schedule})"
    plot_alpha_schedules({f"depth {args.depth}, {title}": a}, out)
    print(f"plot: {out}", file=note)


def _print_table(args, a, b, eff: float, alpha_min: float, label: str) -> None:
    betas = "" if b is None else f" {'beta_attn':>10} {'beta_mlp':>10}"
    print(f"{'block':>5} {'alpha_attn':>10} {'alpha_mlp':>10}{betas} {'cumulative':>11}")
    running = 1.0
    for i, (at, ml) in enumerate(a.tolist()):
        running *= at * ml
        cells = "" if b is None else "".join(f" {x:>10.4f}" for x in b[i].tolist())
        print(f"{i:>5} {at:>10.4f} {ml:>10.4f}{cells} {running:>11.3e}")
    hint = "inside" if 1e-3 <= eff < 1e-2 else "outside"
    if b is None:
        print(f"alpha_eff = {eff:.3e} ({hint} the paper's recommended [1e-3, 1e-2)); depth {args.depth}, "
              f"alpha_min {alpha_min:.4g}, {args.schedule} schedule")
    else:
        trained = " (initial alphas: this formula trains them)" if check_shortcut(args.shortcut).learnable else ""
        print(f"alpha_eff = {eff:.3e} ({hint} the paper's recommended [1e-3, 1e-2)); depth {args.depth}, "
              f"shortcut {label}{trained}; each add is alpha * x + beta * f(x)")


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
    a.set_defaults(func=cmd_alpha)
