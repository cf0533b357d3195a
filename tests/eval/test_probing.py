"""Issue 50's checks of the probing metrics: the swept grid against today's single probe (one head bit for bit, N heads
as N runs), selection blind to test labels, the kNN sweep's paper cell = today's kNN, the token store streaming under
its budget, and the command line end to end (a resdecay checkpoint, a timm ViT, a transformers ViTMAE folder) with
its bad input refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from helpers import assert_one_line_error, run
from resdecay.eval.features import probe as probe_module
from resdecay.eval.features.probe import linear_probe
from resdecay.eval.probing.sweep import Head, knn_sweep, linear_sweep, train_linear_heads
from resdecay.eval.probing.tokens import TokenStore, TokenWriter
from resdecay.eval.probing.train import Split, train_heads
from resdecay.eval.protocol import FAST_RECIPE, IN100_RECIPE, SMALL_ATTENTIVE_RECIPE


def _features(n=400, d=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 5, (n,), generator=g)
    x = torch.randn(n, d, generator=g)
    x[:, :5] += 1.5 * torch.nn.functional.one_hot(y, 5)
    return x, y


@pytest.mark.parametrize("recipe", [replace(IN100_RECIPE, epochs=4, batch_size=64), replace(FAST_RECIPE, epochs=4)])
def test_one_head_of_the_grid_is_todays_probe_bit_for_bit(recipe, monkeypatch):
    x, y = _features()
    xt, yt = _features(150, seed=1)
    seen = []
    monkeypatch.setattr(probe_module, "topk_accuracy", lambda scores, labels, topk: seen.append(scores) or {"top1": 0})
    linear_probe(x, y, xt, yt, recipe)
    scores = train_linear_heads({"f": x}, y, {"test": {"f": xt}}, [Head("f", recipe.lr, recipe.weight_decay)], 5, recipe)
    assert torch.equal(scores[(Head("f", recipe.lr, recipe.weight_decay), "test")], seen[0])


def test_the_grids_heads_in_one_pass_equal_separate_runs():
    x, y = _features()
    xt, _ = _features(100, seed=1)
    feats = {"a": x, "b": torch.cat([x, x.flip(1)], 1)}
    grid = [Head(f, lr, wd) for f in feats for lr in (1e-3, 1e-2) for wd in (0.0, 0.05)]
    recipe = replace(FAST_RECIPE, epochs=3)
    together = train_linear_heads(feats, y, {"test": {f: torch.cat([xt] * (1 + (f == "b")), 1) for f in feats}}, grid, 5,
                                  recipe)
    for head in grid:
        alone = train_linear_heads(feats, y, {"test": {f: torch.cat([xt] * (1 + (f == "b")), 1) for f in feats}},
                                   [head], 5, recipe)
        torch.testing.assert_close(together[(head, "test")], alone[(head, "test")], rtol=1e-5, atol=1e-5)


def test_selection_never_sees_test_labels():
    """Permuting the test labels changes the test accuracy, never the cell chosen (linear, kNN, attentive)."""
    x, y = _features()
    xv, yv = _features(100, seed=2)
    xt, yt = _features(120, seed=1)
    shuffled = yt[torch.randperm(len(yt), generator=torch.Generator().manual_seed(0))]
    grid = [Head("f", lr, 0.0) for lr in (1e-4, 1e-2, 1e-1)]
    recipe = replace(FAST_RECIPE, epochs=3)
    runs = [linear_sweep({"f": x}, y, {"f": xv}, yv, {"f": xt}, labels, grid, recipe) for labels in (yt, shuffled)]
    assert runs[0]["chosen"] == runs[1]["chosen"] and runs[0]["top1"] != runs[1]["top1"]
    knn = [knn_sweep(x, y, xv, yv, xt, labels, (5, 20), (0.07, 0.2)) for labels in (yt, shuffled)]
    assert knn[0]["chosen"] == knn[1]["chosen"] and knn[0]["top1"] != knn[1]["top1"]


def _store(tmp_path, tokens, name, budget=10**9):
    writer = TokenWriter(tmp_path / f"{name}.npy", len(tokens), "float32", {"name": name}, budget)
    for i in range(0, len(tokens), 7):
        writer.add(tokens[i:i + 7])
    return writer.close()


def test_attentive_selection_never_sees_test_labels(tmp_path):
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (90,), generator=g)
    tokens = torch.randn(90, 5, 16, generator=g) + y[:, None, None] * 0.5
    store = _store(tmp_path, tokens, "t")
    train, val, test = (Split(store, np.arange(a, b), y[a:b], prefix=1) for a, b in ((0, 50), (50, 70), (70, 90)))
    recipe = replace(SMALL_ATTENTIVE_RECIPE, epochs=3, warmup_epochs=1, blrs=(1e-3, 1e-2))
    from resdecay.eval.probing.heads import ep_probe

    outs = [train_heads(lambda: ep_probe(16, 3, 4), train, val, replace(test, labels=labels), recipe)
            for labels in (test.labels, test.labels.flip(0))]
    assert outs[0]["chosen"] == outs[1]["chosen"] and outs[0]["sweep"] == outs[1]["sweep"]


def test_the_token_store_streams_under_its_budget(tmp_path):
    tokens = torch.randn(50, 4, 8)
    per_image = 4 * 8 * 4  # float32 bytes
    streamed = _store(tmp_path, tokens, "s", budget=per_image * 6)
    assert streamed.data is None and streamed.chunk == 6 and "streamed" in streamed.access
    whole = TokenStore(streamed.path, 10**9)
    assert whole.data is not None and whole.access == "in memory"
    rows = np.array([40, 3, 17, 3 + 1])
    assert torch.equal(streamed.rows(rows), tokens[rows]) and torch.equal(whole.rows(rows), tokens[rows])
    batches = list(streamed.batches(np.arange(50), 4, torch.Generator().manual_seed(0)))
    assert sorted(np.concatenate(batches).tolist()) == list(range(50))  # every image once
    assert all(b.max() // 6 == b.min() // 6 for b in batches)  # a batch never spans two chunks


@pytest.fixture(scope="module")
def probed(tiny_checkpoints, tmp_path_factory):
    """One eval of the tiny checkpoint with every probing metric beside kNN (short recipes)."""
    out = tmp_path_factory.mktemp("probed")
    argv = ["eval", tiny_checkpoints["decayed"], "--evals", "knn,linear_sweep,knn_sweep,ep,attentive,fewshot",
            "--no-baselines", "--no-progress", "--max-train", "400", "--max-test", "150", "--out", str(out),
            "--cache-dir", str(out / "cache"), "--metric-option", "linear_sweep.epochs=3", "--metric-option",
            "ep.epochs=3", "--metric-option", "attentive.epochs=3", "--metric-option", "fewshot.draws=2",
            "--export-row", str(out / "row.csv")]
    return argv, out


def test_eval_prints_one_table_and_cards_for_every_probe(probed, capsys):
    argv, out = probed
    code, text, err = run(capsys, *argv)
    assert code == 0, err
    report = json.loads(next(out.glob("*/eval.json")).read_text())
    rows = {(r["metric"], r["feature"]): r for r in report["results"]}
    assert {"knn", "linear_sweep", "knn_sweep", "ep", "attentive", "fewshot"} <= {m for m, _ in rows}
    # the kNN sweep's paper cell is today's kNN number, exactly
    assert rows[("knn_sweep", "mean")]["values"]["paper_cell_top1"] == rows[("knn", "mean")]["values"]["top1"]
    ep = rows[("ep", "tokens")]["protocol"]
    assert ep["validation"].startswith("40 of 400 training images, class-balanced") and ep["queries"] == 32
    assert ep["tokens"]["dtype"] == "float16" and ep["recipe"]["name"] == "small" and len(ep["sweep"]) == 3
    assert rows[("linear_sweep", "swept")]["protocol"]["heads"] == 48
    assert {f for m, f in rows if m == "fewshot"} == {"1-shot", "5-shot", "13-shot"}
    for line in ("ep ", "attentive", "linear_sweep", "knn_sweep", "fewshot"):
        assert line in text
    # the leaderboard's row: efficient-probing's results.csv columns, the numbers in percent, the command
    import csv

    (row,) = list(csv.DictReader((out / "row.csv").open()))
    assert row["ep"] == f"{100 * rows[('ep', 'tokens')]['values']['top1']:.2f}" and row["ep_queries"] == "32"
    assert row["lp"] == f"{100 * rows[('linear_sweep', 'swept')]['values']['top1']:.2f}"
    assert row["knn_k"] == str(rows[("knn_sweep", "mean")]["protocol"]["chosen"]["k"])
    assert row["extra_flags"].startswith("resdecay eval ") and "--export-row" in row["extra_flags"]
    code, _, err = run(capsys, *argv)  # the row file is never overwritten
    assert_one_line_error(code, err, "--export-row", "exists")


def test_probes_read_models_trained_elsewhere(tmp_path, capsys):
    """A timm ViT and a transformers ViTMAE folder: the same probes, their tokens through the foreign encoder."""
    import transformers

    folder = tmp_path / "vitmae"
    torch.manual_seed(0)
    transformers.ViTMAEForPreTraining(transformers.ViTMAEConfig(
        image_size=8, patch_size=2, num_channels=1, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
        decoder_intermediate_size=32)).save_pretrained(folder)
    timm_vit = ["timm:vit_tiny_patch16_224", "--model-arg", "img_size=8", "--model-arg", "patch_size=2", "--model-arg",
                "in_chans=1", "--model-arg", "depth=2"]
    for model in (timm_vit, [str(folder)]):
        code, _, err = run(capsys, "eval", "--model", *model, "--data", "digits", "--evals", "knn,linear_sweep,ep",
                           "--no-baselines", "--no-progress", "--max-train", "300", "--max-test", "100", "--metric-option",
                           "linear_sweep.epochs=2", "--metric-option", "ep.epochs=2", "--out", str(tmp_path / "out"))
        assert code == 0, err
    for report in tmp_path.glob("out/*/eval.json"):
        rows = json.loads(report.read_text())["results"]
        ep = next(r for r in rows if r["metric"] == "ep")
        assert ep["protocol"]["prefix_tokens"] == 1 and ep["protocol"]["tokens"]["shape"][1] == 17  # cls + 4x4 patches


@pytest.mark.parametrize("extra, says", [
    (["--metric-option", "ep.queries=0"], "ep.queries"),
    (["--metric-option", "ep.flavour=big"], "flavour"),
    (["--metric-option", "ep.queries=5"], "split into 5 equal chunks"),
    (["--metric-option", "ep.val_fraction=0.001"], "without a validation or training image"),
    (["--metric-option", "ep.val_fraction=0.2", "--metric-option", "attentive.val_fraction=0.3"], "differs from"),
    (["--metric-option", "ep.token_budget_mb=0.0001"], "holds not one image's tokens"),
])
def test_bad_probing_input_is_one_line(tiny_checkpoints, extra, says, tmp_path, capsys):
    evals = "ep,attentive" if len(extra) > 2 else "ep"
    code, _, err = run(capsys, "eval", tiny_checkpoints["decayed"], "--evals", evals, "--no-baselines", "--no-progress",
                       "--max-train", "200", "--max-test", "60", "--out", str(tmp_path / "out"), *extra,
                       "--cache-dir", str(tmp_path / "cache"), "--metric-option", "ep.epochs=1")
    assert_one_line_error(code, err, says)
    assert not (tmp_path / "out").exists() and not any((tmp_path / "cache").rglob("*.npy"))


def test_compare_takes_two_models_probed_alike_and_refuses_two_recipes(tiny_checkpoints, tmp_path, capsys):
    """The chosen cell and the sweep's scores are what a probe found on each model (outcomes, never a reason to
    refuse); the recipe is the protocol (a reason to refuse)."""
    common = ["--evals", "ep", "--no-baselines", "--no-progress", "--max-train", "200", "--max-test", "60",
              "--metric-option", "ep.epochs=2", "--cache-dir", str(tmp_path / "cache")]
    for name, extra in (("plain", []), ("decayed", []), ("decayed", ["--metric-option", "ep.recipe=efficient-probing"])):
        out = tmp_path / f"{name}{len(extra)}"
        code, _, err = run(capsys, "eval", tiny_checkpoints[name], *common, *extra, "--out", str(out))
        assert code == 0, err
    reports = {f.parent.parent.name: f for f in tmp_path.glob("*/*/eval.json")}
    code, text, err = run(capsys, "compare", reports["plain0"], reports["decayed0"], "--out", str(tmp_path / "cmp"))
    assert code == 0, err
    assert "ep top1 (layer" in text
    code, _, err = run(capsys, "compare", reports["decayed0"], reports["decayed2"], "--out", str(tmp_path / "cmp2"))
    assert_one_line_error(code, err, "refusing to compare numbers measured differently", "recipe.name")


def test_a_block_that_gives_a_pooled_vector_is_refused_by_the_token_probes(tiny_checkpoints, tmp_path, capsys, monkeypatch):
    from resdecay.models.encoder import ViTEncoder

    tokens = ViTEncoder.forward_intermediates
    monkeypatch.setattr(ViTEncoder, "forward_intermediates", lambda self, x, idx=None: [t.mean(1) for t in tokens(self, x, idx)])
    code, _, err = run(capsys, "eval", tiny_checkpoints["decayed"], "--evals", "ep", "--no-baselines", "--max-train", "200",
                       "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"))
    assert_one_line_error(code, err, "gives a pooled vector", "knn / probe")
    assert not (tmp_path / "out").exists() and not any((tmp_path / "cache").rglob("*.npy"))


def test_the_probes_measure_raw_pixels_and_the_random_encoder_beside_the_model(tiny_checkpoints, tmp_path, capsys):
    """The baselines of the probing metrics: the run's random-init encoder (its blocks' tokens) and the raw pixels as
    tokens (the model's patches; pooled, the whole image, as the pixel kNN reads it)."""
    code, text, err = run(capsys, "eval", tiny_checkpoints["decayed"], "--evals", "knn,knn_sweep,linear_sweep,ep,attentive",
                          "--no-progress", "--max-train", "300", "--max-test", "100", "--out", str(tmp_path / "out"),
                          "--metric-option", "ep.epochs=1", "--metric-option", "attentive.epochs=1",
                          "--metric-option", "linear_sweep.epochs=2")
    assert code == 0, err
    report = json.loads(next((tmp_path / "out").glob("*/eval.json")).read_text())
    rows = {(r["source"], r["metric"]): r for r in report["baselines"]}
    for metric in ("knn_sweep", "linear_sweep", "ep", "attentive"):
        assert rows[("random-init", metric)]["protocol"]["init_seed"] == 0
    # the pixels' kNN sweep holds the paper cell on the same vectors as the pixel kNN: the same number
    assert rows[("pixels", "knn_sweep")]["values"]["paper_cell_top1"] == rows[("pixels", "knn")]["values"]["top1"]
    assert "2x2 patches" in rows[("pixels", "attentive")]["protocol"]["pixel_tokens"]
    assert ("pixels", "ep") not in rows  # EP's 32 queries cannot split digits' 4-wide pixel patches: no row, no error
    assert "random-init  linear_sweep" in text


def test_the_swept_heads_alone_write_their_cache_into_a_fresh_folder(tiny_checkpoints, tmp_path, capsys):
    """No attentive probe, so no token store creates the cache's folder first: the pooled features' cache file is
    written all the same (it once failed with a traceback on the missing folder), and read back the second time."""
    argv = ["eval", tiny_checkpoints["decayed"], "--evals", "linear_sweep,knn_sweep", "--no-baselines", "--no-progress",
            "--max-train", "200", "--max-test", "60", "--metric-option", "linear_sweep.epochs=2",
            "--cache-dir", str(tmp_path / "fresh" / "cache"), "--out", str(tmp_path / "out")]
    code, _, err = run(capsys, *argv)
    assert code == 0, err
    cached = list((tmp_path / "fresh" / "cache").rglob("*.pt"))
    assert len(cached) == 2  # train and test pooled features
    before = {p: p.stat().st_mtime_ns for p in cached}
    code, _, err = run(capsys, *argv[:-2], "--out", str(tmp_path / "out2"))
    assert code == 0, err
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())  # read back, not written again
