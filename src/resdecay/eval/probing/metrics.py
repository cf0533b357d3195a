"""The probing metrics (opt-in: ``resdecay eval --evals ep,attentive,linear_sweep,knn_sweep,fewshot``).

* ``ep``: efficient-probing's EP head on the patch tokens (Q queries, value width D / d_out), ``attentive``: V-JEPA's
  attentive pooler (depth 1, or more) on them; both trained by an ``AttentiveRecipe`` (``small`` by default, the
  leaderboard's ``efficient-probing``: LARS, blr 0.1, batch 4096, 90 epochs), best epoch and base rate on validation.
* ``linear_sweep``: DINOv2's grid of linear heads (learning rates x weight decays x features), one pass, best on
  validation.
* ``knn_sweep``: k x T chosen on validation; its card also holds the paper cell (k 20, T 0.07) on test, which is the
  ``knn`` metric's number.
* ``fewshot``: kNN and the fast linear probe on 1 / 5 / 13 training images per class, over seeded draws (mean, std).

Every number says what chose it: the validation split (carved from the training images), the grid, the chosen cell.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Annotated, Literal

import numpy as np
import torch

from ...errors import UserError
from ..display import Display, TableSpec
from ..features.knn import knn_topk
from ..features.probe import linear_probe
from ..metrics import Metric, Result
from ..options import AT_LEAST_ONE, Limit
from ..protocol import (
    ATTENTIVE_RECIPES,
    FAST_RECIPE,
    FEW_SHOT_DRAWS,
    FEW_SHOTS,
    IN100_RECIPE,
    KNN_K,
    KNN_SWEEP_K,
    KNN_SWEEP_T,
    KNN_TEMPERATURE,
    SWEEP_FEATURES,
    SWEEP_LRS,
    SWEEP_WEIGHT_DECAYS,
    VAL_FRACTION,
    MetricSettings,
)
from .heads import AttentiveClassifier, ep_probe
from .source import PROBING, ProbingSet, check_head
from .sweep import Head, few_shot_indices, knn_sweep, linear_sweep
from .train import train_heads

FRACTION = Annotated[float, Limit(above=0, most=0.5)]


@dataclass(frozen=True)
class SplitOptions:
    """Shared by every probing metric (they read one validation split and one token store): the fraction of the
    training images held out for selection; how the tokens are stored; the most token bytes held in memory."""

    val_fraction: FRACTION = VAL_FRACTION
    token_dtype: Literal["float16", "float32"] = "float16"
    token_budget_mb: Annotated[float, Limit(above=0)] = 2048.0


@dataclass(frozen=True)
class HeadOptions(SplitOptions):
    """What both attentive probes take: ``NAME.recipe``, ``NAME.epochs`` (None: the recipe's) and ``NAME.tokens``
    (patches: the patch tokens; all: the cls and other prefix tokens too, efficient-probing's ep_all)."""

    recipe: Literal["small", "efficient-probing"] = "small"
    epochs: Annotated[int, AT_LEAST_ONE] | None = None
    tokens: Literal["patches", "all"] = "patches"


@dataclass(frozen=True)
class EpOptions(HeadOptions):
    """``ep.queries`` (Q) and ``ep.d_out`` (value width D / d_out), beside the heads' options."""

    queries: Annotated[int, AT_LEAST_ONE] = 32
    d_out: Annotated[int, AT_LEAST_ONE] = 1


@dataclass(frozen=True)
class AttentiveOptions(HeadOptions):
    """``attentive.depth`` (1: V-JEPA's; 4: a cross block and 3 self-attention blocks), ``attentive.heads`` (None: the
    most of 16, 12, 8, 6, 4, 2 that leaves 16 channels a head), beside the heads' options."""

    depth: Annotated[int, AT_LEAST_ONE] = 1
    heads: Annotated[int, AT_LEAST_ONE] | None = None


@dataclass(frozen=True)
class SweepOptions(SplitOptions):
    """``linear_sweep.epochs``, ``linear_sweep.batch_size``, ``linear_sweep.feature_norm``: the IN-100 recipe's
    schedule (AdamW, per-iteration cosine) at batch 256 for 100 epochs, so that a few thousand images still take
    hundreds of steps (at the IN-100 batch of 1024, 1,400 images are one step an epoch)."""

    epochs: Annotated[int, AT_LEAST_ONE] = 100
    batch_size: Annotated[int, AT_LEAST_ONE] = 256
    feature_norm: Literal["none", "batchnorm"] = "none"


@dataclass(frozen=True)
class FewShotOptions(SplitOptions):
    """``fewshot.draws``: seeded draws of the few training images per shot count."""

    draws: Annotated[int, AT_LEAST_ONE] = FEW_SHOT_DRAWS


def _recipe(o):
    recipe = ATTENTIVE_RECIPES[o.recipe]
    return replace(recipe, epochs=o.epochs, warmup_epochs=min(recipe.warmup_epochs, o.epochs - 1)) if o.epochs else recipe


def _tokens_of(x: ProbingSet, o) -> dict:
    if x.tokens is None:
        raise UserError("the attentive probes read tokens, and none were kept")
    return {k: replace(v, patches_only=o.tokens == "patches") for k, v in x.tokens.items()}


def _attentive(x: ProbingSet, s: MetricSettings, name: str) -> list[Result]:
    o = s.options_of(name)
    splits = _tokens_of(x, o)
    D, C = splits["train"].store.shape[2], int(x.labels["bank"].max()) + 1
    try:
        check_head(name, o, D)
    except UserError:
        if x.pixels:  # EP's queries do not split the raw pixels' width (digits' 2 x 2 patches: 4): no pixel row
            return []
        raise
    if name == "ep":
        make, head = (lambda: ep_probe(D, C, o.queries, o.d_out)), {"head": "EP (efficient-probing)", "queries": o.queries,
                                                                   "d_out": o.d_out}
    else:
        heads = o.heads or next((h for h in (16, 12, 8, 6, 4, 2) if D % h == 0 and D // h >= 16), 1)
        make, head = (lambda: AttentiveClassifier(D, C, heads, o.depth)), {"head": "V-JEPA attentive pooler",
                                                                          "depth": o.depth, "heads": heads}
    recipe = _recipe(o)
    out = train_heads(make, splits["train"], splits["val"], splits["test"], recipe, s.device, s.progress, desc=name)
    card = {**x.card, **head, "recipe": recipe.card(), "tokens_read": o.tokens, "selection": "validation split",
            "chosen": out.pop("chosen"), "sweep": out.pop("sweep"), "effective_batch": out.pop("effective_batch")}
    return [Result("tokens", out, card=card)]


def _linear_sweep(x: ProbingSet, s: MetricSettings) -> list[Result]:
    o = s.options_of("linear_sweep")
    recipe = replace(IN100_RECIPE, name="sweep", epochs=o.epochs, batch_size=o.batch_size, feature_norm=o.feature_norm)
    grid = [Head(f, lr, wd) for f in SWEEP_FEATURES for lr in SWEEP_LRS for wd in SWEEP_WEIGHT_DECAYS]
    p, y = x.pooled, x.labels
    out = linear_sweep(p["train"], y["train"], p["val"], y["val"], p["test"], y["test"], grid, recipe, s.device, s.progress)
    card = {**x.card, "recipe": recipe.card(), "grid": {"features": list(SWEEP_FEATURES), "lrs": list(SWEEP_LRS),
                                                        "weight_decays": list(SWEEP_WEIGHT_DECAYS)},
            "heads": len(grid), "selection": "validation split", "chosen": out.pop("chosen"), "sweep": out.pop("sweep")}
    return [Result("swept", out, card=card)]


def _knn_sweep(x: ProbingSet, s: MetricSettings) -> list[Result]:
    f, p, y = x.feature, x.pooled, x.labels
    out = knn_sweep(p["train"][f], y["train"], p["val"][f], y["val"], p["test"][f], y["test"], KNN_SWEEP_K, KNN_SWEEP_T)
    paper = knn_topk(p["bank"][f], y["bank"], p["test"][f], y["test"], KNN_K, KNN_TEMPERATURE)["top1"]
    card = {**x.card, "grid": {"k": list(KNN_SWEEP_K), "temperature": list(KNN_SWEEP_T)}, "selection": "validation split",
            "bank": "every training image (the validation images too) for the test number", "chosen": out.pop("chosen"),
            "sweep": out.pop("sweep")}
    return [Result(f, {**out, "paper_cell_top1": paper}, card=card)]


def _fewshot(x: ProbingSet, s: MetricSettings) -> list[Result]:
    o, f, p, y = s.options_of("fewshot"), x.feature, x.pooled, x.labels
    counts = torch.bincount(y["bank"])
    results = []
    for shots in FEW_SHOTS:
        if int(counts[counts > 0].min()) < shots:
            continue  # a class with fewer training images than the shots
        knn, lin = [], []
        for draw in range(o.draws):
            rows = torch.as_tensor(few_shot_indices(y["bank"], shots, draw))
            bank, bank_y = p["bank"][f][rows], y["bank"][rows]
            knn.append(knn_topk(bank, bank_y, p["test"][f], y["test"], min(KNN_K, len(rows)), KNN_TEMPERATURE)["top1"])
            lin.append(linear_probe(bank, bank_y, p["test"][f], y["test"], replace(FAST_RECIPE, seed=draw), s.device)["top1"])
        values = {"top1": float(np.mean(lin)), "top1_std": float(np.std(lin)), "knn_top1": float(np.mean(knn)),
                  "knn_top1_std": float(np.std(knn))}
        results.append(Result(f"{shots}-shot", values, card={"shots": shots, "draws": o.draws, "seeds": list(range(o.draws)),
                                                              "linear": asdict(FAST_RECIPE), "knn": {"k": KNN_K,
                                                              "temperature": KNN_TEMPERATURE}}))
    return results


def _chosen_text(p: dict) -> str:
    chosen = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in p["chosen"].items())
    return f"chosen on {p['validation']}: {chosen}"


def _attentive_text(p: dict) -> str:
    r = p["recipe"]
    what = f"Q={p['queries']} d_out={p['d_out']}" if "queries" in p else f"depth {p['depth']}, {p['heads']} heads"
    return (f"{p['head']} {what} on {p['tokens_read']} tokens ({p['tokens']['dtype']}, {p['tokens']['access']}); "
            f"{r['name']} recipe: {r['optimizer']}, batch {p['effective_batch']}, {r['epochs']} epochs; {_chosen_text(p)}")


def _probing_metric(name: str, compute, options, label: str, describe, feature: str = "tokens",
                    values: tuple[str, ...] = ("top1", "val_top1")):
    return Metric(name=name, compute=compute, protocol=lambda s: {}, headline="top1", applies_to=PROBING,
                  where=frozenset({"eval", "profile", "baselines"}), options=options,
                  display=Display(label, describe=describe, table_feature=feature, report_values=values,
                                  table=TableSpec(label[:8], f"d {label[:6]}", None, (8, 8))))


EP = _probing_metric("ep", lambda x, s: _attentive(x, s, "ep"), EpOptions(), "EP probe", _attentive_text)
ATTENTIVE = _probing_metric("attentive", lambda x, s: _attentive(x, s, "attentive"), AttentiveOptions(),
                            "attentive probe", _attentive_text)
LINEAR_SWEEP = _probing_metric("linear_sweep", _linear_sweep, SweepOptions(), "swept linear",
                               lambda p: f"{p['heads']} AdamW heads (features x lr x wd), {p['recipe']['epochs']} epochs; "
                                         f"{_chosen_text(p)}", feature="swept")
KNN_SWEEP = _probing_metric("knn_sweep", _knn_sweep, SplitOptions(), "kNN sweep",
                            lambda p: f"k x T {p['grid']['k']} x {p['grid']['temperature']}; {_chosen_text(p)}",
                            feature="mean")
FEWSHOT = _probing_metric("fewshot", _fewshot, FewShotOptions(), "few-shot",
                          lambda p: f"{p['shots']} per class, {p['draws']} seeded draws: fast linear probe (top1) and kNN",
                          feature="5-shot", values=("top1", "top1_std", "knn_top1", "knn_top1_std"))

METRICS = (EP, ATTENTIVE, LINEAR_SWEEP, KNN_SWEEP, FEWSHOT)  # registered by eval/__init__.py, in this order
