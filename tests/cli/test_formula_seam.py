"""A shortcut formula written as a newcomer writes it (issue 30): it runs even though the trainer builds
models on the meta device, a formula that fails is one line naming it and its file, and every run
says which formula it used."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from helpers import TINY, assert_one_line_error, run
from resdecay.nn import residual
from resdecay.nn.residual import factors_of
from resdecay.train import checkpoint as ckpt

FAST = ["train.epochs=1", "train.warmup_epochs=0", "train.threads=1", "data.train_subset=256", "--no-progress"]  # 4 steps

# torch.arange without device=: under torch.device("meta") this used to make a tensor with no values
RAMP = '''
import torch
from resdecay.nn.residual import register_shortcut


@register_shortcut("ramp")
def ramp(depth, alpha_min, schedule, adds_per_block):
    k = torch.arange(depth * adds_per_block).reshape(depth, adds_per_block)  # int64, default device
    return 1.0 - (1.0 - alpha_min) * k / (depth * adds_per_block - 1), torch.ones(depth, 1)
'''


@pytest.fixture
def formulas_restored():
    """What a plugin registers (its formula, its module) is gone after the test."""
    formulas, modules = dict(residual.SHORTCUT_FORMULAS), set(sys.modules)
    yield
    residual.SHORTCUT_FORMULAS.clear()
    residual.SHORTCUT_FORMULAS.update(formulas)
    for name in set(sys.modules) - modules:
        if name.startswith("resdecay_plugin_"):
            del sys.modules[name]


def plugin(tmp_path, name: str, source: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_a_formula_without_device_trains_through_pretrain(capsys, tmp_path, formulas_restored):
    path = plugin(tmp_path, "ramp.py", RAMP)
    out_dir = tmp_path / "run"
    code, out, err = run(capsys, "--plugin", str(path), "pretrain", "--preset", "mae-tiny-digits",
                         "model.shortcut=ramp", "model.alpha_min=0.5", *TINY, *FAST, f"train.out_dir={out_dir}")
    assert code == 0, err
    model, cfg = ckpt.load_model(ckpt.list_checkpoints(out_dir / "checkpoints")[-1])
    assert cfg.model.shortcut == "ramp"
    adds = [a for block in model.blocks for a in factors_of(block).alphas]
    n = len(adds)
    assert adds == pytest.approx([1.0 - 0.5 * k / (n - 1) for k in range(n)])
    assert all(isinstance(a, float) for a in adds)  # plain floats, not int / meta tensors


def test_a_formula_that_raises_is_one_line_naming_it_and_its_file(capsys, tmp_path, formulas_restored):
    path = plugin(tmp_path, "wrong.py", '''
        from resdecay.nn.residual import register_shortcut


        @register_shortcut("wrong")
        def wrong(depth, alpha_min, schedule, adds_per_block):
            return {"alphas": 1.0}["betas"], 1.0
    ''')
    code, _, err = run(capsys, "--plugin", str(path), "pretrain", "--preset", "mae-tiny-digits", "model.shortcut=wrong",
                       *TINY, *FAST, f"train.out_dir={tmp_path / 'run'}")
    assert_one_line_error(code, err, "shortcut formula 'wrong'", str(path), "KeyError", "fix the formula")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_formula_of_the_wrong_shape_is_one_line(capsys, tmp_path, formulas_restored):
    path = plugin(tmp_path, "long.py", '''
        from resdecay.nn.residual import register_shortcut


        @register_shortcut("too_long")
        def too_long(depth, alpha_min, schedule, adds_per_block):
            return [1.0] * (depth + 1), 1.0
    ''')
    code, _, err = run(capsys, "--plugin", str(path), "pretrain", "--preset", "mae-tiny-digits",
                       "model.shortcut=too_long", *TINY, *FAST, f"train.out_dir={tmp_path / 'run'}")
    assert_one_line_error(code, err, "'too_long'", str(path), "shape (5,)", "expected (4, 2)")


# ----------------------------------------------------------------------------- item 3: runs say their formula
def test_the_description_names_only_the_knobs_a_formula_reads(tmp_path, formulas_restored):
    from resdecay.cli.plugins import load_plugin
    from resdecay.nn.shortcut_info import describe_shortcut, ignored_knobs, knob_warnings

    assert describe_shortcut("decay", 0.6, "cosine") == "decay cosine alpha_min 0.6"
    assert describe_shortcut("decay", 1.0, "cosine") == "plain"
    assert describe_shortcut("decay", 0.6, "linear", "attn") == "decay linear alpha_min 0.6 on attn"
    assert describe_shortcut("scaled_sum", 0.6, "paper") == "scaled_sum"
    assert ignored_knobs("scaled_sum") == ignored_knobs("learnable") == ("alpha_min", "schedule")
    load_plugin(str(plugin(tmp_path, "ramp.py", RAMP)))  # reads alpha_min, not the schedule: found by evaluating it
    assert ignored_knobs("ramp") == ("schedule",)
    assert describe_shortcut("ramp", 0.6, "cosine") == "ramp alpha_min 0.6 (plugin)"
    [line] = knob_warnings("ramp", 0.6, "cosine")
    assert "model.schedule=cosine has no effect" in line and "model.shortcut=ramp" in line
    assert knob_warnings("ramp", 0.6, "linear") == [] and knob_warnings("decay", 0.6, "cosine") == []
    [line] = knob_warnings("scaled_sum", 0.6, "paper")
    assert "model.alpha_min=0.6 and model.schedule=paper have no effect" in line


def test_runs_are_labelled_with_their_formula_in_header_summary_eval_and_compare(capsys, tmp_path, formulas_restored):
    path = plugin(tmp_path, "ramp.py", RAMP)
    evals = []
    for name, extra, said in (("decay", [], "shortcut decay linear alpha_min 0.6, skips"),
                              ("ramp", ["model.shortcut=ramp"], "shortcut ramp alpha_min 0.6 (plugin), skips")):
        out_dir = tmp_path / name
        code, out, err = run(capsys, "--plugin", str(path), "pretrain", "--preset", "mae-tiny-digits", *extra, *TINY, *FAST,
                             f"train.out_dir={out_dir}")
        assert code == 0, err
        assert said in out.splitlines()[0]  # the run header
        summary = json.loads((out_dir / "summary.json").read_text())
        assert (summary["shortcut"], summary["shortcut_label"]) == (name, said.removeprefix("shortcut "))
        code, out, err = run(capsys, "--plugin", str(path), "eval", summary["checkpoint"], "--evals", "knn", "--no-baselines",
                             "--no-progress", "--out", str(tmp_path / f"eval-{name}"))
        assert code == 0, err
        evals.append(next((tmp_path / f"eval-{name}").glob("*/eval.json")))
        assert json.loads(evals[-1].read_text())["label"] == f"mae-tiny-digits ({said.removeprefix('shortcut ')})"
    code, out, err = run(capsys, "compare", *map(str, evals), "--out", str(tmp_path / "cmp"))
    assert code == 0, err
    header = out.splitlines()[0]
    assert "(decay linear alpha_min 0.6, skips)" in header and "(ramp alpha_min 0.6 (plugin), skips)" in header
    assert "[0]" not in header  # two labels, not one label told apart by position


def test_a_knob_the_formula_ignores_is_one_warning(capsys, tmp_path):
    code, out, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "model.shortcut=scaled_sum", *TINY, *FAST,
                         f"train.out_dir={tmp_path / 'run'}")
    assert code == 0, err
    assert "| shortcut scaled_sum, skips |" in out.splitlines()[0]
    assert (out + err).count("has no effect") == 1 and "model.alpha_min=0.6 has no effect" in out + err


def test_alpha_prints_a_registered_formula_table(capsys, tmp_path, formulas_restored):
    code, out, err = run(capsys, "alpha", "--shortcut", "scaled_sum", "--depth", "3", "--out", str(tmp_path / "a.png"))
    assert code == 0, err
    rows = [line.split() for line in out.splitlines()[1:4]]
    assert out.splitlines()[0].split() == ["block", "alpha_attn", "alpha_mlp", "beta_attn", "beta_mlp", "cumulative"]
    assert all(float(x) == pytest.approx(0.5 ** 0.5, abs=1e-4) for r in rows for x in r[1:5])
    assert "shortcut scaled_sum" in out and err == ""  # no alpha_min given: nothing to warn about
    code, out, err = run(capsys, "alpha", "--shortcut", "scaled_sum", "--depth", "3", "--alpha-min", "0.6",
                         "--out", str(tmp_path / "a.png"))
    assert code == 0 and err.count("has no effect") == 1 and "--alpha-min=0.6" in err
    path = plugin(tmp_path, "ramp.py", RAMP)
    code, out, err = run(capsys, "--plugin", str(path), "alpha", "--shortcut", "ramp", "--depth", "2", "--alpha-min",
                         "0.4", "--json", "--out", str(tmp_path / "r.png"))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["label"] == "ramp alpha_min 0.4 (plugin)" and doc["betas"] == [[1.0, 1.0], [1.0, 1.0]]
    assert [a for row in doc["alphas"] for a in row] == pytest.approx([1.0, 0.8, 0.6, 0.4])
    code, _, err = run(capsys, "--plugin", str(path), "alpha", "--shortcut", "ramp", "--depth", "2")
    assert_one_line_error(code, err, "--shortcut ramp reads alpha_min", "--alpha-min")
    code, _, err = run(capsys, "alpha", "--shortcut", "nope", "--depth", "2")
    assert_one_line_error(code, err, "--shortcut 'nope' is unknown", "scaled_sum")


def test_ablate_rows_and_headers_name_each_variants_formula(capsys, tmp_path, formulas_restored):
    path = plugin(tmp_path, "ramp.py", RAMP)
    grid = tmp_path / "grid.yaml"
    grid.write_text("name: labels\npreset: mae-tiny-digits\nbaseline: decay\neval: {evals: [knn]}\nvariants:\n"
                    "  - {name: decay, overrides: [alpha_min=0.6]}\n"
                    "  - {name: mine, overrides: [alpha_min=0.6, model.shortcut=ramp]}\n")
    code, out, err = run(capsys, "--plugin", str(path), "ablate", "--grid", str(grid), "--out", str(tmp_path / "ab"),
                         *TINY, *FAST)
    assert code == 0, err
    assert "=== labels: decay (decay linear alpha_min 0.6, skips) ===" in out
    assert "=== labels: mine (ramp alpha_min 0.6 (plugin), skips) ===" in out
    rows = json.loads((tmp_path / "ab" / "ablate.json").read_text())["rows"]
    assert rows["mine"]["shortcut"] == "ramp alpha_min 0.6 (plugin), skips"
    assert rows["decay"]["shortcut"] == "decay linear alpha_min 0.6, skips"
