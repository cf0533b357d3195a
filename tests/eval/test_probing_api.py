"""The probes from Python (``resdecay.attentive_probe``, ``linear_sweep``, ``knn_sweep``): on the tokens and
features ``resdecay eval`` cached, they give ``eval``'s numbers and chosen cells exactly; bad arguments are one
``UserError`` line each."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import resdecay
from helpers import run
from resdecay.cli import main
from resdecay.errors import UserError


@pytest.fixture(scope="module")
def evaluated(tiny_checkpoints, tmp_path_factory):
    """eval's ep / linear_sweep / knn_sweep rows and the float32 tokens and pooled features it cached."""
    out = tmp_path_factory.mktemp("api")
    code = main(["eval", str(tiny_checkpoints["decayed"]), "--evals", "ep,linear_sweep,knn_sweep",
                              "--no-baselines", "--no-progress", "--max-train", "300", "--max-test", "100", "--out",
                              str(out), "--cache-dir", str(out / "cache"), "--metric-option", "ep.token_dtype=float32",
                              "--metric-option", "ep.epochs=3", "--metric-option", "linear_sweep.epochs=3"])
    assert code in (0, None)
    rows = {r["metric"]: r for r in json.loads(next(out.glob("*/eval.json")).read_text())["results"]}
    cached = {}
    for split in ("train", "test"):
        (pooled,) = [p for p in (out / "cache").rglob(f"{split}-*.pt") if "probing" in p.parts]
        blob = torch.load(pooled, weights_only=True)
        tokens = torch.from_numpy(np.load(pooled.with_name(pooled.stem + "-float32.npy")))
        cached[split] = (blob["pooled"], blob["labels"], tokens)
    return rows, cached


def test_the_attentive_probe_from_python_is_evals_number(evaluated):
    rows, c = evaluated
    got = resdecay.attentive_probe(c["train"][2], c["train"][1], c["test"][2], c["test"][1], head="ep", prefix_tokens=1,
                                   epochs=3)
    ep = rows["ep"]
    assert got["top1"] == ep["values"]["top1"] and got["val_top1"] == ep["values"]["val_top1"]
    assert got["card"]["chosen"] == ep["protocol"]["chosen"] and got["card"]["validation"] == ep["protocol"]["validation"]


def test_the_sweeps_from_python_are_evals_numbers(evaluated):
    rows, c = evaluated
    (tr, tr_y, _), (te, te_y, _) = c["train"], c["test"]
    knn = resdecay.knn_sweep(tr["mean"].numpy(), tr_y.numpy(), te["mean"], te_y)  # numpy arrays too
    assert knn["top1"] == rows["knn_sweep"]["values"]["top1"] and knn["chosen"] == rows["knn_sweep"]["protocol"]["chosen"]
    features = ("cls", "patch_mean", "cls+patch_mean", "cls@last4")
    lin = resdecay.linear_sweep({f: tr[f] for f in features}, tr_y, {f: te[f] for f in features}, te_y, epochs=3)
    assert lin["top1"] == rows["linear_sweep"]["values"]["top1"]
    assert lin["chosen"] == rows["linear_sweep"]["protocol"]["chosen"] and len(lin["sweep"]) == 48


def test_bad_probe_arguments_are_one_line(evaluated):
    _, c = evaluated
    (tr, tr_y, tok), (te, te_y, te_tok) = c["train"], c["test"]
    cases = [
        (lambda: resdecay.attentive_probe(tr["mean"], tr_y, te["mean"], te_y), "reads tokens (N, T, D)"),
        (lambda: resdecay.attentive_probe(tok, tr_y, te_tok, te_y, head="mlp"), "choose 'ep' or 'attentive'"),
        (lambda: resdecay.attentive_probe(tok, tr_y, te_tok, te_y, queries=0), "queries"),
        (lambda: resdecay.attentive_probe(tok, tr_y, te_tok, te_y, flavour=1), "flavour"),
        (lambda: resdecay.knn_sweep(tr["mean"], tr_y, te["mean"], te_y, val_fraction=0.9), "val_fraction"),
        (lambda: resdecay.knn_sweep(tr["mean"], tr_y, te["mean"], te_y, ks=()), "the grid has no cell"),
        (lambda: resdecay.linear_sweep(tr["mean"], tr_y, te["mean"], te_y, lrs=()), "the grid has no cell"),
        (lambda: resdecay.linear_sweep({"a": tr["mean"]}, tr_y, {"b": te["mean"]}, te_y), "give both the same features"),
        (lambda: resdecay.linear_sweep(tr["mean"], ["x"], te["mean"], te_y), "train_labels must be a torch.Tensor"),
    ]
    for call, says in cases:
        with pytest.raises(UserError, match=None) as e:
            call()
        assert says in str(e.value) and "\n" not in str(e.value), (says, str(e.value))


def test_the_cli_and_python_share_the_validation_rule(tiny_checkpoints, tmp_path, capsys):
    """A validation fraction that leaves a class empty is the same refusal from both doors."""
    labels = torch.arange(10).repeat(3)
    with pytest.raises(UserError, match="without a validation or training image"):
        resdecay.knn_sweep(torch.randn(30, 4), labels, torch.randn(5, 4), labels[:5], val_fraction=0.05)
    code, _, err = run(capsys, "eval", tiny_checkpoints["decayed"], "--evals", "knn_sweep", "--no-baselines", "--max-train",
                       30, "--metric-option", "knn_sweep.val_fraction=0.05", "--out", tmp_path)
    assert code == 2 and "without a validation or training image" in err
