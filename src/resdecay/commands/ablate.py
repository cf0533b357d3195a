"""``resdecay ablate --grid GRID``: a paired ablation runner.

Every variant of a grid trains with the same seed, data order and budget, from the same initial
weights wherever the shapes allow (a parameter is copied from the baseline's initialisation
unless either side deliberately starts it at zero, so zero-init switches keep their meaning),
and is measured by the evaluation suite with one protocol. The table gives each measurement,
its delta against the baseline, and the paper's number and delta beside it where the paper has
one. A half-finished grid resumes: finished variants are read back, a killed one continues
from its last checkpoint. The table's columns are the registered ``features`` metrics
(``eval/metrics.py``): a metric a plugin registers gets its columns without an edit here.
``--seeds`` runs the whole grid once per seed (``commands/ablate_seeds.py``).

Grid YAML::

    name: table3b-toy
    preset: mae-tiny-fmnist                 # base preset of every variant
    overrides: [train.epochs=4, ...]        # for every variant
    baseline: plain residual                # deltas are against this variant
    eval: {evals: [knn, probe, rank], probe_epochs: 100, max_train: 20000}
    paper: {metric: "ImageNet-100 linear probe, ViT-B (Table 3b)", compare_to: probe_top1}
    variants:
      - {name: plain residual, overrides: [alpha_min=1.0], paper: 76.5}
      - {name: decay both, overrides: [alpha_min=0.6], paper: 83.6}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

import torch

from .. import yaml_io
from ..errors import UserError
from ..eval.features.baselines import default_baseline_cache
from ..eval.metrics import FEATURES, Metric, registered, row_columns
from ..eval.suite import LEGACY_KEYS, EvalSettings, evaluate_checkpoint
from ..models import build_model
from ..nn.shortcut_info import describe_model
from ..train import distributed as dist_env
from ..train import train
from ..train.config import RunConfig, checked_values, load_config, parse_value
from ..train.distributed import is_main_process
from ..train.log.tracking import tracker_group
from ..viz.online_figures import online_hooks
from ..viz.plots import plot_bars, plot_rank_vs_depth

# the evaluation settings a grid's ``eval:`` section and ``eval.KEY=VALUE`` set (the data and the progress bars are the run's)
GRID_EVAL_KEYS = ["evals", "layer", "feature", "max_train", "max_test", "batch_size", "num_workers", "device", "cache_dir",
                  "baselines", "pixel_cache", "trackers", "metric_options"]
GRID_KEYS = ("name", "description", "preset", "overrides", "baseline", "eval", "paper", "variants")
VARIANT_KEYS = ("name", "preset", "overrides", "paper")


def table_metrics() -> list[Metric]:
    """The metrics ``ablate``'s table has columns for: every registered ``features`` metric, in order."""
    return registered(FEATURES)


def list_grids() -> list[str]:
    return sorted(p.name[:-5] for p in (resources.files("resdecay") / "grids").iterdir() if p.name.endswith(".yaml"))


def load_grid(grid: str) -> dict:
    path = Path(grid)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = Path(str(resources.files("resdecay") / "grids" / f"{grid}.yaml"))
        if not path.is_file():
            raise UserError(f"grid {grid!r} does not exist; shipped grids: {', '.join(list_grids())} (or a path to a .yaml file)")
    g = yaml_io.load_document(path.read_text(), f"grid {path}") or {}  # YAML 1.2 floats; a bad file is one line
    if not isinstance(g, dict):  # a list's items would be reported as unknown keys
        raise UserError(f"grid {path} holds a YAML {type(g).__name__}, not a mapping; write it as keys: name, preset, "
                        "baseline, variants (a list of {name, overrides}), as in `resdecay ablate --list`'s grids")
    bad = [k for k in g if k not in GRID_KEYS]
    if bad:
        raise UserError(f"grid key {bad[0]!r} does not exist; valid keys: {', '.join(GRID_KEYS)}")
    for k in ("name", "preset", "variants"):
        if k not in g:
            raise UserError(f"grid {path} has no '{k}'")
    names = []
    for v in g["variants"]:
        bad = [k for k in v if k not in VARIANT_KEYS]
        if bad:
            raise UserError(f"variant key {bad[0]!r} does not exist; valid keys: {', '.join(VARIANT_KEYS)}")
        names.append(v["name"])
    if len(set(names)) != len(names):
        raise UserError(f"grid {path} repeats a variant name")
    if g.get("baseline", names[0]) not in names:
        raise UserError(f"baseline {g['baseline']!r} is not a variant of the grid; variants: {', '.join(names)}")
    g.setdefault("baseline", names[0])
    valid = {f.name for f in fields(EvalSettings)} | set(LEGACY_KEYS)  # older grid files' keys still read
    bad = [k for k in g.get("eval", {}) if k not in valid]
    if bad:
        raise UserError(f"eval key {bad[0]!r} does not exist; valid keys: {', '.join(sorted(valid))}")
    return g


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def shared_init(reference: dict):
    """Copy the baseline's initial weights wherever name and shape match and neither side is a
    deliberately all-zero start (zero-init layers)."""

    @torch.no_grad()
    def init(model: torch.nn.Module) -> None:
        for name, own in model.state_dict().items():
            ref = reference.get(name)
            if ref is None or ref.shape != own.shape or not own.is_floating_point():
                continue
            if bool((own == 0).all()) or bool((ref == 0).all()):
                continue
            own.copy_(ref.to(own.device))

    return init


def _measure(report: dict, source: str | None = None) -> dict:
    """The table's values from a report, ``{column: value}`` (knn_top1, probe_top1, rank_cls, ...): the
    model's (source None) or a baseline's ("pixels", "random-init"; pixels have no cls token, so their
    rank is of the pixel vector)."""
    out = {}
    rows = report["results"] if source is None else [r for r in report.get("baselines", []) if r["source"] == source]
    for r in rows:
        out.update(row_columns(r, table_only=True))
    return out


@dataclass
class GridPlan:
    """One grid resolved before anything trains: every variant's config, where it goes, what to measure.

    Args:
        grid: the loaded grid; cfgs: variant name -> its RunConfig; out_dir: the grid's folder;
        only: the variants to run now (None: all); settings: the evaluation settings of every variant.
    """

    grid: dict
    cfgs: dict[str, RunConfig]
    out_dir: Path
    only: list[str] | None
    settings: EvalSettings


def split_eval_overrides(extra: list[str]) -> tuple[dict, list[str]]:
    """The ``eval.<setting>=<value>`` pairs of ``extra`` (the grid's evaluation settings, e.g. ``eval.num_workers=2``
    on a machine with fewer cores than the grid was written for), typed, and the training overrides left."""
    evals, rest = {}, []
    for pair in extra:
        key, sep, raw = pair.partition("=")
        if not key.startswith("eval."):
            rest.append(pair)
            continue
        if not sep:
            raise UserError(f"{pair!r} is not eval.KEY=VALUE (for example eval.num_workers=2)")
        evals[key.removeprefix("eval.").replace("-", "_")] = parse_value(raw)
    if isinstance(evals.get("evals"), str):  # eval.evals=knn,rank: a list, as a grid file writes it
        evals["evals"] = [e.strip() for e in evals["evals"].split(",")]
    return checked_values(EvalSettings, evals, "eval", GRID_EVAL_KEYS), rest


def plan_grid(grid: str, out: str | None = None, only: list[str] | None = None, extra: list[str] | None = None,
              progress: bool = True) -> GridPlan:
    """Load a grid and resolve every variant's config first: a typo fails before hours of training, not after."""
    g = load_grid(grid)
    evals, extra = split_eval_overrides(extra or [])
    g["eval"] = {**g.get("eval", {}), **evals}  # recorded as the protocol of ablate.json, as if the grid said so
    names = [v["name"] for v in g["variants"]]
    if only:
        unknown = [n for n in only if n not in names]
        if unknown:
            raise UserError(f"variant {unknown[0]!r} is not in grid {g['name']}; variants: {', '.join(names)}")
    out_dir = Path(out or f"runs/ablate/{g['name']}")
    cfgs = {v["name"]: load_config(v.get("preset", g["preset"]), [*g.get("overrides", []), *v.get("overrides", []), *extra,
                                                                   f"train.out_dir={out_dir / slug(v['name'])}"])
            for v in g["variants"]}
    # raw pixels are measured once per data set and protocol, not once per variant (cache shared with `eval --baseline pixels`)
    settings = EvalSettings.from_dict({"pixel_cache": str(default_baseline_cache()), **g.get("eval", {}), "progress": progress})
    settings.validate()  # an unknown metric or a bad value: refused now, not after the first variant trained
    return GridPlan(g, cfgs, out_dir, only, settings)


def run_plan(plan: GridPlan, env, progress: bool = True) -> dict:
    """Train and evaluate what a plan still lacks (under one torchrun process group, ``env``); on rank 0
    write ablate.json, table.txt and the figures and return the summary ({} on other ranks)."""
    base_cfg = plan.cfgs[plan.grid["baseline"]]
    torch.manual_seed(base_cfg.train.seed)  # what train() does before it builds the model
    reference = {k: v.clone() for k, v in build_model(base_cfg.model).state_dict().items()}
    rows = _run_variants(plan.grid, plan.cfgs, plan.only, plan.settings, reference, progress, env)
    if not is_main_process():
        return {}
    return _report(plan.grid, rows, plan.out_dir)


def run_grid(grid: str, out: str | None = None, only: list[str] | None = None, extra: list[str] | None = None,
             progress: bool = True) -> dict:
    plan = plan_grid(grid, out, only, extra, progress)
    # Under torchrun one process group spans the whole grid, and every rank waits at a barrier while rank 0
    # evaluates a variant: otherwise rank 1 starts the next variant's group alone and times out.
    env = dist_env.setup(plan.cfgs[plan.grid["baseline"]].train.device)
    try:
        with tracker_group(plan.grid["name"], plan.out_dir):  # one W&B group / MLflow experiment and store per grid
            return run_plan(plan, env, progress)
    finally:
        dist_env.cleanup(env)


def _run_variants(g: dict, cfgs: dict, only, settings, reference: dict, progress: bool, env) -> dict:
    """Train (all ranks) and evaluate (rank 0) each variant not yet done; rank 0's rows for the table."""
    rows = {}
    for v in g["variants"]:
        name, cfg = v["name"], cfgs[v["name"]]
        run_dir = cfg.out_dir
        done = run_dir / "eval" / "eval.json"
        if only and name not in only and not done.exists():
            continue
        summary_file = run_dir / "summary.json"
        if not done.exists() and not summary_file.exists():
            if env.is_main:
                print(f"\n=== {g['name']}: {name} ({describe_model(cfg.model)}) ===")
            train(cfg, hooks=online_hooks(), resume="auto", progress=progress, init=shared_init(reference))  # rank 0 writes summary.json
        dist_env.barrier(env)  # rank 0's summary.json is on disk for every rank
        if not done.exists():  # every rank gives the same answer: eval.json is written only before the next barrier
            # every torchrun rank helps extract features (eval.suite splits them); rank 0 alone gets the report
            report = evaluate_checkpoint(json.loads(summary_file.read_text())["checkpoint"], settings)
            if env.is_main:
                done.parent.mkdir(parents=True, exist_ok=True)
                done.write_text(json.dumps({**report, "label": name}, indent=2))
        dist_env.barrier(env)  # no rank starts the next variant's training before rank 0 has written this one
        if not env.is_main:
            continue  # other torchrun ranks help train; rank 0 evaluates and reports
        report = json.loads(done.read_text())
        model = report.get("model", {})
        rows[name] = {"measures": _measure(report), "random_init": _measure(report, "random-init"),
                      "pixels": _measure(report, "pixels"), "paper": v.get("paper"), "run_dir": str(run_dir),
                      "shortcut": describe_model(cfg.model),  # the formula in words (nn.shortcut_info)
                      "overrides": v.get("overrides", []), "alphas": report.get("alphas"), "family": model.get("family"),
                      "alpha_min": model.get("alpha_min"), "depth": sum(model["layers"]) if "layers" in model else model.get("depth")}
    return rows


def _report(g: dict, rows: dict, out_dir: Path) -> dict:
    """ablate.json, table.txt, the bar chart (and Figure 7's rank-vs-depth plot for ResNet grids)."""
    result = summarize(g, rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ablate.json").write_text(json.dumps(result, indent=2))
    table = format_table(result)
    (out_dir / "table.txt").write_text(table + "\n")
    print("\n" + table)
    keys = [m.display.key for m in table_metrics()]
    groups = {k: {n: r["measures"][k] for n, r in rows.items() if k in r["measures"]} for k in keys}
    plot_bars({k: v for k, v in groups.items() if v}, out_dir / "ablate.png", f"{g['name']}: {g.get('description', '')}")
    if len({r["depth"] for r in rows.values()}) > 1 and all(r["family"] == "resnet" for r in rows.values()):
        plot_rank_vs_depth(rows, out_dir / "rank_vs_depth.png", g["name"])  # Figure 7
    print(f"\nwrote {out_dir / 'ablate.json'}, {out_dir / 'table.txt'}, {out_dir / 'ablate.png'}")
    return result


def summarize(g: dict, rows: dict) -> dict:
    base = rows.get(g["baseline"])
    paper = g.get("paper", {})
    key = paper.get("compare_to", "probe_top1")
    for name, r in rows.items():
        r["delta"] = {m: r["measures"][m] - base["measures"][m] for m in r["measures"] if base and m in base["measures"]}
        pb = base.get("paper") if base else None
        if r["paper"] is not None and pb is not None:
            r["paper_delta"] = r["paper"] - pb
            ours = r["delta"].get(key)
            if name != g["baseline"] and ours is not None and r["paper_delta"] != 0:
                r["direction"] = "same" if (ours > 0) == (r["paper_delta"] > 0) else "opposite"
    pixels = next((r["pixels"] for r in rows.values() if r.get("pixels")), {})
    return {"grid": g["name"], "description": g.get("description", ""), "baseline": g["baseline"], "pixels": pixels,
            "protocol": {"eval": g.get("eval", {}), "preset": g["preset"], "overrides": g.get("overrides", [])},
            "paper_metric": paper.get("metric"), "compared_to": key, "rows": rows}


def _cell(x, width: int, signed: bool = False) -> str:
    if x is None:
        return f"{'-':>{width}}"
    return f"{x:>+{width}.3f}" if signed else f"{x:>{width}.3f}"


def format_table(result: dict) -> str:
    """The grid as a table: per metric its value and delta against the baseline, the random-init
    columns, and the paper's number, delta and whether ours moves the same way."""
    specs = [(m.display.key, m.display.table) for m in table_metrics()]
    rand = [(key, t) for key, t in specs if t.random]
    head = (f"{'variant':<28} " + " ".join(f"{t.header:>{t.widths[0]}} {t.delta:>{t.widths[1]}}" for _, t in specs)
            + "".join(f" {t.random:>{max(8, len(t.random))}}" for _, t in rand) + f" {'paper':>6} {'d paper':>8} {'direction':>9}")
    lines = [f"{result['grid']}: deltas against '{result['baseline']}'; paper = {result.get('paper_metric') or '-'}; "
             f"direction compares d {result['compared_to']} with d paper", head, "-" * len(head)]
    for name, r in result["rows"].items():
        m, d, ri = r["measures"], r["delta"], r.get("random_init", {})
        paper = f"{r['paper']:>6.1f}" if r["paper"] is not None else f"{'-':>6}"
        pd = f"{r['paper_delta']:>+8.1f}" if "paper_delta" in r else f"{'-':>8}"
        lines.append(f"{name:<28} " + " ".join(f"{_cell(m.get(k), t.widths[0])} {_cell(d.get(k), t.widths[1], True)}" for k, t in specs)
                     + "".join(f" {_cell(ri.get(k), max(8, len(t.random)))}" for k, t in rand)
                     + f" {paper} {pd} {r.get('direction', '-'):>9}")
    px = result.get("pixels") or {}
    if px:
        cells = " ".join(f"{_cell(px.get(k), t.widths[0])} {'':>{t.widths[1]}}" for k, t in specs)
        lines.append(f"{'raw pixels (no model)':<28} {cells}".rstrip())
    lines.append(f"{' / '.join(t.random for _, t in rand)}: the same variant's encoder at its random initialisation "
                 "(before training), same protocol")
    return "\n".join(lines)
