"""``resdecay alpha``: print and plot an alpha schedule, solve alpha_min for a target alpha_eff, or
(``shortcut``) print a registered shortcut formula's table, a plugin's included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UserError
from ..nn.residual import check_shortcut, shortcut_plan
from ..nn.shortcut_info import describe_shortcut, ignored_knobs, knob_warnings
from ..schedule import alpha_schedule, effective_decay, solve_alpha_min
from ..viz.plots import plot_alpha_schedules


def _alpha_min(depth: int, alpha_min: float | None, target_eff: float | None, schedule: str, shortcut: str | None,
               note) -> float:
    """--alpha-min, or the one --target-eff solves for; with --shortcut a formula that ignores
    alpha_min needs neither."""
    if shortcut is not None and alpha_min is None and target_eff is None:
        if "alpha_min" in ignored_knobs(shortcut):
            return 1.0
        raise UserError(f"--shortcut {shortcut} reads alpha_min: give --alpha-min (e.g. --alpha-min 0.6)")
    if (alpha_min is None) == (target_eff is None):
        raise UserError("give exactly one of --alpha-min (to see its schedule) or --target-eff (to solve for alpha_min)")
    if target_eff is None:
        return alpha_min
    if shortcut not in (None, "decay"):
        raise UserError(f"--target-eff solves the decay schedule's alpha_min; with --shortcut {shortcut} "
                        "give --alpha-min instead")
    solved = solve_alpha_min(depth, target_eff, schedule)
    print(f"alpha_min {solved:.6f} gives alpha_eff {target_eff:.3g} at depth {depth} ({schedule} schedule)", file=note)
    return solved


def run_alpha(depth: int, alpha_min: float | None = None, target_eff: float | None = None, schedule: str = "linear",
              shortcut: str | None = None, out: str | None = None, as_json: bool = False) -> None:
    """Print the schedule's table (or, ``as_json``, one JSON document) and plot it.

    Args:
        depth: transformer blocks; alpha_min: the last sub-block's alpha, or None to solve it for
        target_eff; schedule: the decay schedule; shortcut: a registered formula's name (its alphas and
        betas); out: the PNG (default runs/alpha/alpha_d<depth>_<alpha_min>_<schedule>.png);
        as_json: stdout carries the JSON document alone.
    """
    # with --json, stdout carries the JSON document alone; every message goes to stderr
    note = sys.stderr if as_json else sys.stdout
    try:
        if shortcut is not None:
            check_shortcut(shortcut, keys=("--shortcut", "--decay-branches"))
        alpha_min = _alpha_min(depth, alpha_min, target_eff, schedule, shortcut, note)
        if shortcut is None:
            a, b = alpha_schedule(depth, alpha_min, schedule), None
        else:
            plan = shortcut_plan(depth, alpha_min, schedule, shortcut=shortcut)
            a, b = plan.alphas, plan.betas
    except ValueError as e:  # ConfigError included
        raise UserError(str(e)) from None
    if shortcut is not None:
        for line in knob_warnings(shortcut, alpha_min, schedule, keys=("--shortcut", "--alpha-min", "--schedule")):
            print(line, file=sys.stderr)
    eff = effective_decay(a)
    label = describe_shortcut(shortcut or "decay", alpha_min, schedule)
    if as_json:
        doc = {"depth": depth, "alpha_min": alpha_min, "schedule": schedule, "alpha_eff": eff, "alphas": a.tolist()}
        if b is not None:
            doc.update(shortcut=shortcut, label=label, betas=b.tolist())
        print(json.dumps(doc))
    else:
        _print_table(depth, schedule, shortcut, a, b, eff, alpha_min, label)
    suffix = f"_{shortcut}" if shortcut else ""
    path = Path(out or f"runs/alpha/alpha_d{depth}_{alpha_min:.3f}_{schedule}{suffix}.png")
    title = label if shortcut else f"alpha_min {alpha_min:.3g} ({schedule})"
    plot_alpha_schedules({f"depth {depth}, {title}": a}, path)
    print(f"plot: {path}", file=note)


def _print_table(depth: int, schedule: str, shortcut: str | None, a, b, eff: float, alpha_min: float, label: str) -> None:
    betas = "" if b is None else f" {'beta_attn':>10} {'beta_mlp':>10}"
    print(f"{'block':>5} {'alpha_attn':>10} {'alpha_mlp':>10}{betas} {'cumulative':>11}")
    running = 1.0
    for i, (at, ml) in enumerate(a.tolist()):
        running *= at * ml
        cells = "" if b is None else "".join(f" {x:>10.4f}" for x in b[i].tolist())
        print(f"{i:>5} {at:>10.4f} {ml:>10.4f}{cells} {running:>11.3e}")
    hint = "inside" if 1e-3 <= eff < 1e-2 else "outside"
    if b is None:
        print(f"alpha_eff = {eff:.3e} ({hint} the paper's recommended [1e-3, 1e-2)); depth {depth}, "
              f"alpha_min {alpha_min:.4g}, {schedule} schedule")
    else:
        trained = " (initial alphas: this formula trains them)" if check_shortcut(shortcut).learnable else ""
        print(f"alpha_eff = {eff:.3e} ({hint} the paper's recommended [1e-3, 1e-2)); depth {depth}, "
              f"shortcut {label}{trained}; each add is alpha * x + beta * f(x)")
