"""The metric record: what a metric measures (name, compute, protocol, headline, direction, input kind,
its own options) apart from how it is shown (``Display``); the headline required and checked against
the first result; metric-owned options set with ``--metric-option NAME.KEY=VALUE``, typed and checked
before any feature is extracted, the built-in flags (--k, --seg-solver, ...) setting the same options."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Annotated, Literal

import pytest
import torch

from helpers import assert_one_line_error, run
from resdecay.cli.main import build_parser
from resdecay.commands.evaluate import eval_settings
from resdecay.errors import UserError
from resdecay.eval import options as opts
from resdecay.eval.display import Column, Display
from resdecay.eval.features import source as features_source
from resdecay.eval.metrics import (
    FEATURES,
    FeatureSet,
    Metric,
    Result,
    column_metric,
    get_metric,
    measure,
    register_metric,
    registered,
    unregister_metric,
)
from resdecay.eval.protocol import MetricSettings
from resdecay.eval.segmentation.segment import SegProtocol
from resdecay.eval.suite import EvalSettings


def _nothing(inputs, settings):
    return []


@pytest.fixture
def scratch():
    """Metrics a test registers are gone afterwards."""
    before = {m.name for m in registered()}
    yield
    for name in {m.name for m in registered()} - before:
        unregister_metric(name)


def test_the_record_says_what_is_measured_and_its_display_how_it_is_shown():
    fields = [f.name for f in dataclasses.fields(Metric)]
    assert fields == ["name", "compute", "protocol", "headline", "higher_is_better", "applies_to", "where",
                      "extra_pools", "options", "check", "display", "flags"]  # was 18, with the display mixed in
    assert [f.name for f in dataclasses.fields(Display)] == ["label", "describe", "column", "table_feature", "titles",
                                                             "report_values", "log_scale", "table", "grid", "filled"]
    with pytest.raises(TypeError, match="headline"):  # no default: a metric without a top-1 says what it has
        Metric(name="x", compute=_nothing, protocol=lambda s: {})
    with pytest.raises(UserError, match="headline must name"):
        Metric(name="x", compute=_nothing, protocol=lambda s: {}, headline="")
    m = Metric(name="plain", compute=_nothing, protocol=lambda s: {}, headline="score")
    assert (m.display.label, m.display.key, m.display.report_values) == ("plain", "plain_score", ("score",))
    assert m.display.table.header == "plain" and m.display.describe({}) == ""
    assert m.columns("mean", {"score": 0.5}) == {"plain_score": 0.5}


def test_builtin_column_keys_titles_and_tables_are_unchanged():
    """The keys eval.json rows, profile rows, the online log and ablate's table are read by."""
    keys = {m.name: m.display.key for m in registered()}
    assert keys == {"knn": "knn_top1", "probe": "probe_top1", "rank": "rank_cls", "token_norm": "feature_norm",
                    "shortcut_ratio": "shortcut_ratio_", "fid": "proxy_fid", "diffusion_probe": "probe_best_top1",
                    "segmentation": "segmentation_miou", "diagnostics": "diag_direct_share", "ep": "ep_top1",
                    "attentive": "attentive_top1", "linear_sweep": "linear_sweep_top1", "knn_sweep": "knn_sweep_top1",
                    "fewshot": "fewshot_top1"}
    per_feature = {("rank", "patch_mean"): "rank_patch_mean", ("shortcut_ratio", "mlp"): "shortcut_ratio_mlp",
                   ("fid", "inception"): "inception_fid", ("knn", "cls"): "knn_top1", ("token_norm", "tokens"): "feature_norm"}
    for (name, feature), key in per_feature.items():
        assert get_metric(name).display.column_of(feature) == key
        assert column_metric(key).name == name and column_metric(f"online_{key}").name == name
    assert column_metric("rank_") is None and column_metric("fid") is None  # a per-feature key has a feature
    assert column_metric("probe_best_top1").name == "diffusion_probe"  # not probe's: fixed keys match whole
    assert [get_metric(n).display.report_values for n in ("knn", "rank", "segmentation")] == [
        ("top1", "top5"), ("effective_rank",), ("miou", "pixel_acc", "miou_majority")]
    tables = {m.name: (m.display.table.header, m.display.table.random, m.display.table.widths) for m in registered(FEATURES)}
    assert tables == {"knn": ("kNN", "kNN rand", (7, 7)), "probe": ("probe", "prb rand", (7, 8)),
                      "rank": ("rank cls", None, (8, 7))}
    assert get_metric("token_norm").display.log_scale and not get_metric("fid").higher_is_better
    assert Column("a_", "_b", by_feature=True).of("x") == "a_x_b" and Column("a_", "_b", by_feature=True).holds("a_x_b")


def test_a_result_without_its_headline_is_one_clear_error(scratch):
    bad = Metric(name="bad", compute=lambda fs, s: [Result(fs.feature, {"acc": 0.5, "n": 3})],
                 protocol=lambda s: {}, headline="score")
    x = torch.randn(8, 4)
    fs = FeatureSet({"mean": x}, torch.arange(8) % 2, {"mean": x}, torch.arange(8) % 2, "mean")
    with pytest.raises(UserError, match=r"metric 'bad' returned a result without its headline 'score' \(it returned acc, n\)"):
        measure([bad], fs, MetricSettings(), {}, 0)
    good = dataclasses.replace(bad, headline="acc")
    rows, columns = measure([good], fs, MetricSettings(), {}, 0)
    assert columns == {"bad_acc": 0.5} and rows[0]["values"] == {"acc": 0.5, "n": 3}


def test_a_plugin_without_its_headline_fails_eval_in_one_line(tiny_checkpoints, tmp_path, capsys, scratch):
    plugin = tmp_path / "nohead.py"
    plugin.write_text("from resdecay.eval.metrics import Metric, Result, register_metric\n"
                      "register_metric(Metric(name='nohead', compute=lambda fs, s: [Result(fs.feature, {'acc': 1.0})],\n"
                      "                       protocol=lambda s: {}, headline='top1'), replace=True)\n")
    code, _, err = run(capsys, "--plugin", plugin, "eval", tiny_checkpoints["decayed"], "--evals", "nohead",
                       "--no-baselines", "--no-progress", "--out", tmp_path / "o", "--cache-dir", tmp_path / "c")
    assert_one_line_error(code, err, "metric 'nohead'", "headline 'top1'", "it returned acc")


def test_options_are_declared_parsed_typed_and_resolved(scratch):
    assert opts.parse_assignments(["knn.k=10", "cka.reference=-1", "knn.temperature = 0.1"]) == {
        "knn": {"k": "10", "temperature": "0.1"}, "cka": {"reference": "-1"}}
    for item in ("knnk=3", "knn.=3", ".k=3", "knn.k"):
        with pytest.raises(UserError, match="is not NAME.KEY=VALUE"):
            opts.parse_assignments([item])

    @dataclass(frozen=True)
    class Typed:
        n: int = 3
        scale: float = 1.0
        on: bool = False
        mode: Literal["a", "b"] = "a"
        cap: int | None = None

    register_metric(Metric(name="typed", compute=_nothing, protocol=lambda s: {}, headline="v", options=Typed()))
    register_metric(Metric(name="loose", compute=_nothing, protocol=lambda s: {}, headline="v",
                           options={"depth": 2, "tag": None}))
    names = [m.name for m in registered()]
    given = opts.checked({"typed": {"n": "5", "scale": "2", "on": "yes", "mode": "B", "cap": "none"},
                          "loose": {"depth": 4, "tag": "x"}}, names)  # text from the CLI, values from a grid file
    assert given == {"typed": {"n": 5, "scale": 2.0, "on": True, "mode": "b", "cap": None}, "loose": {"depth": 4, "tag": "x"}}
    s = MetricSettings(options=given)
    assert s.options_of("typed") == Typed(n=5, scale=2.0, on=True, mode="b", cap=None)
    assert s.options_of("loose") == {"depth": 4, "tag": "x"} and MetricSettings().options_of("loose") == {"depth": 2, "tag": None}
    assert MetricSettings().options_of("typed") == Typed() and MetricSettings().options_of("rankless") == {}
    for bad, needle in (({"nope": {"k": "1"}}, "no metric named 'nope'"),
                        ({"typed": {"size": "1"}}, "metric 'typed' has no option 'size'; its options are n, scale, on"),
                        ({"rank": {"exp": "maybe"}}, "rank.exp takes true or false, got 'maybe'"),
                        ({"typed": {"n": "2.5"}}, "typed.n takes an integer, got '2.5'"),
                        ({"typed": {"n": True}}, "typed.n takes an integer"),
                        ({"typed": {"mode": "c"}}, "typed.mode takes one of a, b, got 'c'"),
                        ({"typed": {"cap": "lots"}}, "typed.cap takes an integer (or none: the default)"),
                        ({"fid": {"x": "1"}}, "metric 'fid' has no option 'x'; it has no options")):
        with pytest.raises(UserError, match=re.escape(needle)):
            opts.checked(bad, names)
    with pytest.raises(UserError, match="option 'shape' has type"):  # a command line cannot write a tuple
        register_metric(Metric(name="tupled", compute=_nothing, protocol=lambda s: {}, headline="v",
                               options={"shape": (1, 2)}))
    assert get_metric("tupled") is None
    unregister_metric("typed")
    assert opts.declared("typed") is None


def test_builtin_flags_set_the_builtin_metrics_options():
    flags = ["--k", "5", "--temperature", "0.1", "--rank-exp", "--probe-epochs", "3", "--probe-norm", "batchnorm",
             "--seg-solver", "kmeans", "--seg-seed", "2"]
    s = eval_settings(build_parser().parse_args(["eval", *flags]))
    ms = s.metric_settings()
    assert (ms.options_of("knn").k, ms.options_of("knn").temperature, ms.options_of("rank").exp) == (5, 0.1, True)
    assert get_metric("knn").protocol(ms) == {"k": 5, "temperature": 0.1, "vote": "exp(cos/T)"}
    assert get_metric("probe").protocol(ms)["probe"] == {**ms.probe.card(), "epochs": 3, "feature_norm": "batchnorm"}
    assert ms.options_of("segmentation") == SegProtocol(solver="kmeans", seed=2)
    # --metric-option wins over the flag that sets the same option
    s = eval_settings(build_parser().parse_args(["eval", *flags, "--metric-option", "knn.k=7", "--metric-option",
                                                 "segmentation.solver=learned"]))
    ms = s.metric_settings()
    assert ms.options_of("knn").k == 7 and ms.options_of("knn").temperature == 0.1
    assert ms.options_of("segmentation") == SegProtocol(solver="learned", seed=2)
    assert get_metric("rank").protocol(ms) == {"form": "exp(entropy) (Roy & Vetterli)"}
    # online tracking's shorthand (its bank may be smaller than k), and the defaults with nothing set
    assert MetricSettings(knn_k=4).options_of("knn").k == 4 and MetricSettings().options_of("knn").k == 20
    assert get_metric("probe").protocol(MetricSettings())["probe"]["epochs"] == 200


def test_metric_option_on_the_cli_is_the_flag_it_stands_for(tiny_checkpoints, tmp_path, capsys):
    ck, cache = tiny_checkpoints["decayed"], ["--cache-dir", str(tmp_path / "c"), "--no-baselines", "--no-progress"]
    rows = {}
    for name, extra in (("flag", ["--k", "5"]), ("option", ["--metric-option", "knn.k=5", "--metric-option",
                                                            "knn.temperature=0.07"])):
        code, out, err = run(capsys, "eval", ck, "--evals", "knn", *extra, *cache, "--out", tmp_path / name)
        assert code == 0, err
        assert "k=5 T=0.07" in out
        rows[name] = json.loads(next((tmp_path / name).glob("*/eval.json")).read_text())["results"]
    assert rows["flag"] == rows["option"] and rows["option"][0]["protocol"]["k"] == 5


def test_bad_metric_options_stop_eval_before_any_feature_is_extracted(tiny_checkpoints, tmp_path, capsys, monkeypatch):
    def never(*a, **k):
        raise AssertionError("features were extracted before the options were checked")

    monkeypatch.setattr(features_source, "extract_block_features", never)
    ck, where = tiny_checkpoints["decayed"], ["--no-progress", "--out", str(tmp_path / "o"), "--cache-dir", str(tmp_path / "c")]
    for option, needles in (("svm.k=3", ("no metric named 'svm'", "knn, probe, rank")),
                            ("knn.neighbours=3", ("metric 'knn' has no option 'neighbours'", "its options are k, temperature")),
                            ("knn.k=many", ("knn.k=many", "knn.k takes an integer, got 'many'")),
                            ("knn.temperature=warm", ("knn.temperature takes a number",)),
                            ("probe.feature_norm=layernorm", ("probe.feature_norm takes one of none, batchnorm",)),
                            ("knn.k", ("'knn.k' is not NAME.KEY=VALUE",)),
                            ("knn.k=0", ("knn.k must be a positive integer, got 0",)),
                            ("knn.k=5000", ("--k 5000 is larger than the kNN bank",)),
                            ("probe.epochs=0", ("probe.epochs must be a positive integer, got 0",))):
        assert_one_line_error(*run(capsys, "eval", ck, "--metric-option", option, *where)[::2], *needles)


BAD_TEMPERATURES = ["nan", "0", "-1", "inf"]  # issue 38.6: each was accepted and wrote a garbage top-1 to eval.json


@pytest.mark.parametrize("args, needles", [
    *[(["--temperature", t], (f"--temperature {float(t)}: knn.temperature must be a positive finite number",))
      for t in BAD_TEMPERATURES],
    *[(["--metric-option", f"knn.temperature={t}"], (f"--metric-option knn.temperature={t}:",
                                                     "knn.temperature must be a positive finite number"))
      for t in BAD_TEMPERATURES],
    (["--k", "-3"], ("--k -3: knn.k must be a positive integer, got -3",)),
    (["--probe-epochs", "-2"], ("--probe-epochs -2: probe.epochs must be a positive integer",)),
    (["--seg-images", "0"], ("--seg-images 0: segmentation.images must be a positive integer",)),
    (["--seg-k", "1"], ("--seg-k 1: segmentation.k must be an integer >= 2",)),
    (["--seg-seed", "-1"], ("segmentation.seed must be an integer in [0, 4294967295]",)),
    (["--metric-option", "segmentation.lr=0"], ("segmentation.lr must be a positive finite number, got 0",)),
    (["--metric-option", "segmentation.ema=1.5"], ("segmentation.ema must be a number in [0, 1], got 1.5",)),
    (["--metric-option", "segmentation.min_weight=nan"], ("segmentation.min_weight must be a number in [-1, 1]",)),
    *[(["--seg-ignore-index", v], (f"--seg-ignore-index {v}: segmentation.ignore_index must be an integer in "
                                   f"[0, 65535], got {v}",)) for v in ("-1", "70000")],
    (["--metric-option", "segmentation.ignore_index=70000"], ("segmentation.ignore_index must be an integer in [0, 65535]",)),
    # beyond a C integer: was an OverflowError traceback from inside the probe's epoch loop
    (["--metric-option", f"probe.epochs={10**23}"], (f"probe.epochs must be a positive integer below 2**63, got {10**23}",)),
    (["--probe-epochs", str(10**23)], (f"--probe-epochs {10**23}: probe.epochs must be a positive integer below 2**63",)),
    (["--k", str(10**23)], ("knn.k must be a positive integer below 2**63",)),
])
def test_every_metric_option_is_range_checked_where_it_enters_the_cli(tiny_checkpoints, tmp_path, capsys, monkeypatch,
                                                                       args, needles):
    """Issue 38.6: a value outside the option's declared range is one line, exit 2, before any feature is
    extracted and before the report folder is made (no eval.json of a garbage number)."""
    def never(*a, **k):
        raise AssertionError("features were extracted before the options were checked")

    monkeypatch.setattr(features_source, "extract_block_features", never)
    code, _, err = run(capsys, "eval", tiny_checkpoints["decayed"], "--evals", "knn,probe,rank,segmentation", *args,
                       "--no-progress", "--out", tmp_path / "o", "--cache-dir", tmp_path / "c")
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("value", [float("nan"), 0, -1.0, float("inf"), "nan", "-0.5"])
def test_every_metric_option_is_range_checked_in_the_python_settings(value):
    """Issue 38.6, the same ranges for EvalSettings (the flags' and --metric-option's fields), MetricSettings and
    resdecay.knn_accuracy: one line naming the option."""
    import resdecay

    if not isinstance(value, str):
        with pytest.raises(UserError, match=re.escape("knn.temperature must be a positive finite number")) as e:
            eval_settings(build_parser().parse_args(["eval", "--temperature", str(value)])).validate()
        assert "\n" not in str(e.value) and str(e.value).startswith(f"--temperature {value}")
        with pytest.raises(UserError, match=r"^knn.temperature=.*: knn.temperature must be a positive finite number"):
            MetricSettings(options={"knn": {"temperature": value}})
        x = torch.randn(8, 4)
        with pytest.raises(UserError, match=r"^knn_accuracy\(temperature=.*\): knn.temperature must be a positive"):
            resdecay.knn_accuracy(x, torch.arange(8) % 2, x, torch.arange(8) % 2, k=3, temperature=value)
    with pytest.raises(UserError, match=r"^--metric-option knn.temperature=.*: knn.temperature must be a positive finite"):
        EvalSettings(metric_options={"knn": {"temperature": value}}).validate()
    with pytest.raises(UserError, match=re.escape("segmentation.lr=-2.0: segmentation.lr must be a positive finite")):
        EvalSettings.from_dict({"metric_options": {"segmentation": {"lr": -2.0}}}).validate()
    assert EvalSettings.from_dict({"knn_temperature": 1, "metric_options": {"segmentation": {"k": None}}}).metric_settings(
    ).options_of("knn").temperature == 1.0


def test_a_metric_declares_its_options_ranges_with_their_types(scratch):
    """A plugin's Limit is checked like the built-ins'; floats are finite without one; a Limit on text, or a default
    outside its own range, is refused when the metric registers."""
    @dataclass(frozen=True)
    class Ranged:
        share: Annotated[float, opts.Limit(least=0, most=1)] = 0.5
        tries: Annotated[int, opts.Limit(least=3)] | None = None
        scale: float = 1.0

    register_metric(Metric(name="ranged", compute=_nothing, protocol=lambda s: {}, headline="v", options=Ranged()))
    register_metric(Metric(name="loose", compute=_nothing, protocol=lambda s: {}, headline="v", options={"gain": 1.0}))
    names = [m.name for m in registered()]
    assert opts.checked({"ranged": {"share": "1", "tries": "none", "scale": "-2"}}, names) == {
        "ranged": {"share": 1.0, "tries": None, "scale": -2.0}}
    for bad, needle in (({"ranged": {"share": "1.5"}}, "ranged.share must be a number in [0, 1], got 1.5"),
                        ({"ranged": {"tries": "2"}}, "ranged.tries must be an integer >= 3, got 2"),
                        ({"ranged": {"scale": "inf"}}, "ranged.scale must be a finite number, got inf"),
                        ({"loose": {"gain": "nan"}}, "loose.gain must be a finite number, got nan")):
        with pytest.raises(UserError, match=re.escape(needle)):
            opts.checked(bad, names)

    @dataclass(frozen=True)
    class Wrong:
        share: Annotated[float, opts.POSITIVE] = 0.0

    @dataclass(frozen=True)
    class Text:
        name: Annotated[str, opts.POSITIVE] = "a"

    for options, needle in ((Wrong(), "the default wrong.share=0.0: wrong.share must be a positive finite number"),
                            (Text(), "option 'name' has a Limit but type <class 'str'>")):
        with pytest.raises(UserError, match=re.escape(needle)):
            register_metric(Metric(name="wrong", compute=_nothing, protocol=lambda s: {}, headline="v", options=options))
        assert get_metric("wrong") is None


def test_an_option_of_a_metric_not_evaluated_is_one_warning_not_silence(tiny_checkpoints, capsys, tmp_path):
    assert EvalSettings(evals=("rank",), metric_options={"knn": {"k": "5"}}).unused_options() == ["knn.k"]
    assert EvalSettings(evals=("knn",), metric_options={"knn": {"k": "5"}}).unused_options() == []
    code, out, err = run(capsys, "eval", tiny_checkpoints["plain"], "--evals", "rank", "--metric-option", "knn.k=5",
                         "--no-baselines", "--max-test", "64", "--no-progress", "--out", tmp_path)
    assert code == 0, err
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: --metric-option knn.k set for a metric not in --evals (rank): ignored; "
                        "add it to --evals to run it"], out
