"""The metric registry (issue 21.3): built-in metrics are registry entries, eval.json rows come from one
function, and a metric registered by a plugin file reaches eval.json, the report, compare, ablate's
table and the online log without an edit anywhere else."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from helpers import TINY, assert_one_line_error, run
from resdecay.errors import RegistryError, UserError
from resdecay.eval.metrics import (
    FEATURES,
    Metric,
    Result,
    column_title,
    get_metric,
    metric_names,
    register_metric,
    registered,
    result_row,
    unregister_metric,
)
from resdecay.eval.reports import format_report
from resdecay.eval.suite import EvalSettings

PLUGIN = Path(__file__).parent.parent.parent / "docs" / "examples" / "extending" / "rankme.py"


@pytest.fixture
def rankme():
    """The RankMe plugin loaded as ``--plugin`` loads it, and removed again so no other test sees it."""
    from resdecay.cli.plugins import load_plugin

    load_plugin(str(PLUGIN))
    yield get_metric("rankme")
    unregister_metric("rankme")
    for name in [n for n in sys.modules if n.startswith("resdecay_plugin_rankme_")]:
        del sys.modules[name]  # a later --plugin of the same file imports (and registers) it afresh


def test_builtin_metrics_are_registry_entries():
    assert [m.name for m in registered(FEATURES)][:3] == ["knn", "probe", "rank"]
    assert [m.display.key for m in registered(FEATURES)][:3] == ["knn_top1", "probe_top1", "rank_cls"]
    assert {m.name for m in registered()} >= {"knn", "probe", "rank", "token_norm", "shortcut_ratio", "fid", "diffusion_probe"}
    assert [m.name for m in registered(where="profile") if m.applies_to != FEATURES] == [
        "token_norm", "shortcut_ratio", "diagnostics", "ep", "attentive", "linear_sweep", "knn_sweep", "fewshot"]
    assert column_title("online_knn_top1") == "kNN top-1 (k=20, T=0.07)"
    assert column_title("online_proxy_fid").endswith("(lower is better)")
    assert column_title("rank_patch_mean") == "effective rank (paper eq. 6, mean-pooled patch tokens)"
    assert column_title("no_such_column") == "no_such_column"
    assert get_metric("rank").columns("mean", {"effective_rank": 2.0}) == {"rank_mean": 2.0}


def test_register_metric_refuses_bad_entries_in_one_line():
    def nothing(inputs, settings):
        return []

    def make(**kw):
        return Metric(**{"name": "ok", "compute": nothing, "protocol": lambda s: {}, "headline": "top1", **kw})

    for kw, needle in (({"name": "Bad Name"}, "must be lower-case"), ({"name": "knn"}, "already registered"),
                       ({"applies_to": "pixels"}, "applies_to 'pixels' is unknown"),
                       ({"where": frozenset({"never"})}, "where 'never' is unknown")):
        with pytest.raises(RegistryError, match=needle):
            register_metric(make(**kw))
    assert get_metric("ok") is None


def test_result_row_is_the_one_shape_of_eval_json_rows():
    row = result_row("knn", 3, "mean", {"top1": 0.5}, {"k": 20})
    assert list(row) == ["metric", "layer", "feature", "values", "protocol"]
    row = result_row("knn", None, "pixels", {"top1": 0.9}, {"k": 20}, source="pixels")
    assert list(row) == ["metric", "source", "layer", "feature", "values", "protocol"] and row["source"] == "pixels"


@pytest.mark.slow
def test_plugin_metric_reaches_eval_json_report_compare_and_ablate(rankme, tiny_checkpoints, tmp_path, capsys):
    """Issue 21.3 / 21.6c: one file + one registration -> eval.json, the report, compare, ablate's columns."""
    assert "rankme" in metric_names() and "rankme" in EvalSettings().evals  # default: every registered metric
    out = tmp_path / "ev"
    for name in ("decayed", "plain"):
        code, text, err = run(capsys, "--plugin", str(PLUGIN), "eval", tiny_checkpoints[name], "--evals", "knn,rankme",
                              "--no-progress", "--out", str(out), "--cache-dir", str(tmp_path / "cache"))
        assert code == 0, err
        assert "rankme" in text and "RankMe: exp(entropy" in text and "k=20 T=0.07" in text
    reports = sorted(out.glob("*/eval.json"))
    rep = json.loads(reports[0].read_text())
    row = next(r for r in rep["results"] if r["metric"] == "rankme")
    assert (row["feature"], row["protocol"]["eps"], row["protocol"]["split"]) == ("mean", 1e-7, "test")
    assert row["protocol"]["train"]["images"] == 1437 and 1 <= row["values"]["rankme"] <= 32
    assert {r["source"] for r in rep["baselines"] if r["metric"] == "rankme"} == {"pixels", "random-init"}
    code, text, err = run(capsys, "compare", *map(str, reports), "--out", str(tmp_path / "cmp"))
    assert code == 0 and "rankme rankme (layer 3, mean)" in text, err
    assert_one_line_error(*run(capsys, "eval", tiny_checkpoints["plain"], "--evals", "svm", "--out", str(tmp_path))[::2],
                          "unknown evaluation 'svm'", "rankme")

    from resdecay.commands import ablate as ab

    rows = {name: {"measures": ab._measure(json.loads(p.read_text())), "random_init": {}, "paper": None}
            for name, p in zip(("decayed", "plain"), reports, strict=True)}
    assert set(rows["plain"]["measures"]) == {"knn_top1", "rankme"}
    result = ab.summarize({"name": "g", "baseline": "plain", "preset": "x"}, rows)
    assert result["rows"]["plain"]["delta"]["rankme"] == 0.0
    table = ab.format_table(result)
    assert "RankMe" in table.splitlines()[1] and "d RankMe" in table.splitlines()[1]


@pytest.mark.slow
def test_plugin_metric_is_logged_online(rankme, tmp_path):
    from resdecay.eval.online import OnlineEval
    from resdecay.models import build_model
    from resdecay.train.config import load_config

    cfg = load_config("mae-tiny-digits", [*TINY, "train.epochs=1"])
    torch.manual_seed(0)
    rows = []

    class Log:
        def write(self, row):
            rows.append(row)

    OnlineEval(cfg, every=1, size=64, device=torch.device("cpu"))(build_model(cfg.model), 0, 5, Log())
    assert {"online_knn_top1", "online_probe_top1", "online_rank_cls", "online_rank_mean", "online_rankme"} <= set(rows[0])
    assert rows[0]["online_protocol"]["rankme"]["eps"] == 1e-7


def test_a_metric_not_registered_now_is_still_reported():
    """A report written with a plugin that is not loaded now: its rows print every number, no protocol text."""
    card = {"train": {"data": "digits", "images": 10}, "test": {"images": 5}}
    rows = [result_row("knn", 3, "mean", {"top1": 0.5, "top5": 0.9}, {**card, "k": 20, "temperature": 0.07}),
            result_row("mystery", 3, "mean", {"score": 1.25, "note": "x"}, card)]
    text = format_report({"label": "run", "checkpoint": "c.pt", "step": 1, "checkpoint_sha256": "0" * 64, "results": rows})
    assert "top1 0.5000, top5 0.9000" in text and "k=20 T=0.07" in text
    assert "mystery" in text and "score 1.2500" in text


def test_compute_results_feed_columns_in_registry_order(rankme):
    from resdecay.eval.metrics import FeatureSet, measure
    from resdecay.eval.protocol import MetricSettings

    torch.manual_seed(0)
    x, y = torch.randn(60, 8), torch.arange(60) % 3
    fs = FeatureSet({"mean": x[:40]}, y[:40], {"cls": x[40:] * 2, "mean": x[40:]}, y[40:], "mean")
    metrics = [get_metric(n) for n in ("knn", "rank", "rankme")]
    rows, columns = measure(metrics, fs, MetricSettings(knn_k=5), {"norm": "none"}, 2)
    assert [(r["metric"], r["feature"]) for r in rows] == [("knn", "mean"), ("rank", "cls"), ("rank", "mean"), ("rankme", "mean")]
    assert list(columns) == ["knn_top1", "rank_cls", "rank_mean", "rankme"]
    assert rows[0]["protocol"] == {"norm": "none", "layer": 2, "feature": "mean", "k": 5, "temperature": 0.07, "vote": "exp(cos/T)"}
    assert isinstance(rows[-1]["values"]["rankme"], float) and Result("a", {}).extra == {}


def test_a_layers_metric_reads_every_block_and_is_opt_in():
    """A ``layers`` metric gets one ``LayerSet`` per evaluated block (every block's test features) and runs only
    when ``--evals`` names it, so the default evaluation extracts what it always did."""
    from resdecay.eval.metrics import LAYERS, LayerSet, measure
    from resdecay.eval.protocol import MetricSettings

    def gap(x: LayerSet, s) -> list[Result]:
        ref = s.options_of("gap")["reference"] % len(x.blocks)
        return [Result(x.feature, {"gap": float((x.blocks[x.layer] - x.blocks[ref]).norm())}, card={"blocks": [ref, x.layer]})]

    m = register_metric(Metric(name="gap", compute=gap, protocol=lambda s: {"reference": s.options_of("gap")["reference"]},
                               headline="gap", applies_to=LAYERS, where=frozenset({"eval", "profile"}),
                               options={"reference": 0}))
    try:
        blocks = {b: torch.full((5, 3), float(b)) for b in range(4)}
        rows, columns = measure([m], LayerSet(2, blocks, torch.zeros(5), "mean"), MetricSettings(), {"norm": "none"}, 2)
        assert columns == {"gap_gap": pytest.approx(2 * 15 ** 0.5)}
        assert rows[0]["layer"] == 2 and rows[0]["protocol"] == {"norm": "none", "layer": 2, "feature": "mean",
                                                                 "reference": 0, "blocks": [0, 2]}
        ms = MetricSettings(options={"gap": {"reference": -1}})
        assert measure([m], LayerSet(1, blocks, torch.zeros(5), "mean"), ms, {}, 1)[1] == {"gap_gap": pytest.approx(2 * 15 ** 0.5)}
        assert "gap" not in EvalSettings().evals and EvalSettings().metrics(LAYERS) == []
        assert EvalSettings(evals=("knn", "gap")).metrics(LAYERS) == [m] and EvalSettings(evals=("gap",), layer="all").metrics(LAYERS) == [m]
        EvalSettings(evals=("gap",), metric_options={"gap": {"reference": "2"}}).validate()
        with pytest.raises(UserError, match="gap.reference takes an integer"):
            EvalSettings(evals=("gap",), metric_options={"gap": {"reference": "last"}}).validate()
    finally:
        unregister_metric("gap")
