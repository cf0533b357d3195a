"""resdecay eval / compare / online tracking: protocol cards, caching, profile, refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import TINY, assert_one_line_error, run
from helpers import train_online as train
from resdecay.eval.features import source as features_source
from resdecay.eval.suite import EvalSettings, evaluate_checkpoint
from resdecay.train.config import load_config

FAST = dict(metric_options={"probe": {"epochs": 5}}, progress=False)


def test_report_carries_protocol_cards(tiny_checkpoints, tmp_path):
    rep = evaluate_checkpoint(tiny_checkpoints["decayed"], EvalSettings(cache_dir=str(tmp_path), **FAST))
    metrics = {(r["metric"], r["feature"]) for r in rep["results"]}
    assert metrics == {("knn", "mean"), ("probe", "mean"), ("rank", "mean"), ("rank", "cls")}
    knn = next(r for r in rep["results"] if r["metric"] == "knn")
    p = knn["protocol"]
    assert (p["k"], p["temperature"], p["layer"], p["feature"], p["norm"]) == (20, 0.07, 3, "mean", "none")
    assert p["train"]["images"] == 1437 and p["test"]["images"] == 360 and p["train"]["augmentation"] == "none"
    assert 0 <= knn["values"]["top1"] <= knn["values"]["top5"] <= 1
    probe = next(r for r in rep["results"] if r["metric"] == "probe")
    assert probe["protocol"]["probe"]["epochs"] == 5 and probe["protocol"]["probe"]["lr"] == 1e-2
    assert rep["model"]["alpha_min"] == 0.6 and len(rep["checkpoint_sha256"]) == 64


def test_feature_cache_is_reused_and_invalidated(tiny_checkpoints, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = features_source.extract_block_features

    def counting(*a, **k):
        calls["n"] += 1
        return real(*a, **k)

    monkeypatch.setattr(features_source, "extract_block_features", counting)
    s = EvalSettings(evals=("knn",), cache_dir=str(tmp_path), baselines=False, **FAST)  # baselines: own test
    first = evaluate_checkpoint(tiny_checkpoints["decayed"], s)
    assert calls["n"] == 2 and not first["cache"]["train_hit"]
    again = evaluate_checkpoint(tiny_checkpoints["decayed"], s)
    assert calls["n"] == 2 and again["cache"]["train_hit"] and again["cache"]["test_hit"]
    assert again["results"] == first["results"]
    evaluate_checkpoint(tiny_checkpoints["decayed"], EvalSettings(evals=("knn",), cache_dir=str(tmp_path), max_train=500,
                                                                  baselines=False, **FAST))
    assert calls["n"] == 3  # new protocol (bank size): train features again, test features reused
    evaluate_checkpoint(tiny_checkpoints["plain"], s)
    assert calls["n"] == 5  # another checkpoint: both splits again


@pytest.mark.slow
def test_per_layer_profile_has_one_row_per_block(tiny_checkpoints, tmp_path):
    rep = evaluate_checkpoint(tiny_checkpoints["decayed"], EvalSettings(layer="all", cache_dir=str(tmp_path), **FAST))
    prof = rep["profile"]
    assert [r["layer"] for r in prof] == [0, 1, 2, 3]
    for r in prof:
        assert {"knn_top1", "probe_top1", "rank_cls", "rank_mean", "feature_norm", "shortcut_ratio_attn", "shortcut_ratio_mlp"} <= set(r)
        assert r["shortcut_ratio_attn"] > 0 and r["feature_norm"] > 0
    assert rep["profile_protocol"]["probe"]["feature_norm"] == "batchnorm"


@pytest.mark.slow
def test_eval_cli_and_compare(tiny_checkpoints, tmp_path, capsys):
    out = tmp_path / "ev"
    for name in ("decayed", "plain"):
        code, text, err = run(capsys, "eval", tiny_checkpoints[name], "--probe-epochs", "5", "--no-progress", "--out", str(out),
                              "--cache-dir", str(tmp_path / "cache"))
        assert code == 0, err
        assert "knn" in text and "k=20 T=0.07" in text
    reports = sorted(out.glob("*/eval.json"))
    assert len(reports) == 2
    code, text, err = run(capsys, "compare", *map(str, reports), "--out", str(tmp_path / "cmp"))
    assert code == 0, err
    assert "knn top1 (layer 3, mean)" in text and "plain" in text
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 1000
    # a different protocol (k=5) is refused, naming the field; --force shows it marked
    code, _, err = run(capsys, "eval", tiny_checkpoints["plain"], "--evals", "knn", "--k", "5", "--no-progress",
                       "--out", str(tmp_path / "k5"), "--cache-dir", str(tmp_path / "cache"))
    assert code == 0
    k5 = next((tmp_path / "k5").glob("*/eval.json"))
    code, _, err = run(capsys, "compare", str(reports[0]), str(k5), "--out", str(tmp_path / "cmp2"))
    assert_one_line_error(code, err, "refusing to compare", "k (20 vs 5)", "--force")
    code, text, _ = run(capsys, "compare", str(reports[0]), str(k5), "--force", "--out", str(tmp_path / "cmp2"))
    assert code == 0 and " *" in text and "protocols differ in k (20 vs 5)" in text


def test_eval_bad_input(tiny_checkpoints, tmp_path, capsys):
    junk = tmp_path / "junk.pt"
    torch.save({"state_dict": {}}, junk)
    ck = tiny_checkpoints["decayed"]
    cache = ["--cache-dir", str(tmp_path / "c"), "--no-progress", "--out", str(tmp_path / "o")]
    assert_one_line_error(*run(capsys, "eval", str(junk), *cache)[::2], "not a resdecay checkpoint")
    assert_one_line_error(*run(capsys, "eval", ck, "--layer", "7", *cache)[::2], "--layer 7 is out of range", "4 blocks")
    assert_one_line_error(*run(capsys, "eval", ck, "--layer", "deep", *cache)[::2], "--layer must be a block index")
    assert_one_line_error(*run(capsys, "eval", ck, "--evals", "knn", "--k", "5000", *cache)[::2], "--k 5000 is larger than the kNN bank")
    assert_one_line_error(*run(capsys, "eval", ck, "--evals", "knn,svm", *cache)[::2], "unknown evaluation 'svm'")
    assert_one_line_error(*run(capsys, "compare", str(tmp_path / "nothing"), str(tmp_path))[::2], "no evaluation found")
    assert_one_line_error(*run(capsys, "compare", str(tmp_path))[::2], "compare needs at least two runs")
    assert_one_line_error(*run(capsys, "eval", ck, "--probe-norm", "layernorm", *cache)[::2], "--probe-norm 'layernorm' is unknown")
    assert_one_line_error(*run(capsys, "eval", ck, "--feature", "max", *cache)[::2], "--feature 'max' is unknown")
    run_folder = str(Path(ck).parent.parent)  # a run folder where a checkpoint file is asked for: its newest is named
    assert_one_line_error(*run(capsys, "eval", run_folder, *cache)[::2], "is a folder, not a checkpoint file", Path(ck).name)


def test_labels_missing_and_wrong_images_are_one_clear_line(tiny_checkpoints, tmp_path, capsys):
    import numpy as np
    from PIL import Image

    from helpers import write_idx

    one = tmp_path / "one"  # IDX files whose labels are all the same class: nothing to classify
    one.mkdir()
    for prefix in ("train", "t10k"):
        write_idx(one / f"{prefix}-images-idx3-ubyte.gz", np.random.default_rng(0).integers(0, 256, (40, 8, 8)))
        write_idx(one / f"{prefix}-labels-idx1-ubyte.gz", np.zeros(40))
    common = ["--no-progress", "--cache-dir", str(tmp_path / "c"), "--out", str(tmp_path / "o")]
    code, _, err = run(capsys, "eval", tiny_checkpoints["decayed"], "--data", "fashion-mnist", "--data-path", str(one), *common)
    assert_one_line_error(code, err, "fewer than 2 classes")
    for split in ("train", "val"):  # RGB photos into a model trained on 1-channel digits
        d = tmp_path / "rgb" / split / "a"
        d.mkdir(parents=True)
        Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(d / "0.png")
    code, _, err = run(capsys, "eval", tiny_checkpoints["decayed"], "--data", "imagefolder", "--data-path", str(tmp_path / "rgb"), *common)
    assert_one_line_error(code, err, "the images have 3 channel(s) but", "takes 1")


@pytest.mark.slow
def test_online_tracking_logs_and_resumes(tmp_path):
    # 512 training digits, 8 steps an epoch (not 22): the online evaluation still draws its 300 of them. The CSV tracker
    # alone: what is checked is log.jsonl; a tracker that shows images would get each evaluation's figures drawn
    small = ["data.train_subset=512", "train.loggers=[csv]", f"train.out_dir={tmp_path}"]
    cfg = load_config("mae-tiny-digits", [*TINY, "train.epochs=4", "train.online_eval_every=2", "train.online_eval_size=300",
                                          *small])
    train(cfg, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    online = [r for r in rows if "online_knn_top1" in r]
    assert [r["epoch"] for r in online] == [2.0, 4.0]
    assert all(0 <= r["online_probe_top1"] <= 1 and r["online_rank_cls"] >= 0 for r in online)
    assert online[0]["online_protocol"]["bank"] == "300 of 512 train images, class-balanced, seed 0"
    # resume a longer run from the last checkpoint: the curve continues, nothing repeated
    cfg = load_config("mae-tiny-digits", [*TINY, "train.epochs=6", "train.online_eval_every=2", "train.online_eval_size=300",
                                          *small])
    train(cfg, resume="auto", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if "online_knn_top1" in r] == [2.0, 4.0, 6.0]


@pytest.mark.slow
def test_distributed_extraction_equals_single_process(tiny_checkpoints, tmp_path, capsys):
    """Under torchrun each rank extracts every world_size-th image; gathered, nothing is lost or doubled."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = ["-m", "resdecay", "eval", tiny_checkpoints["decayed"], "--evals", "knn", "--no-progress", "--device", "cpu"]
    # the single-process side in this process, with the one thread each torchrun rank has (what is tested is the
    # torchrun side; the single run is its reference and needs no interpreter of its own)
    torch.set_num_threads(1)
    code, _, err = run(capsys, *base[2:], "--cache-dir", str(tmp_path / "one"), "--out", str(tmp_path / "o1"))
    assert code == 0, err
    multi = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29541",
                            *base, "--cache-dir", str(tmp_path / "two"), "--out", str(tmp_path / "o2")],
                           capture_output=True, text=True, env=env, timeout=300)
    assert multi.returncode == 0, multi.stdout + multi.stderr
    for split in ("train", "test"):
        a = torch.load(next((tmp_path / "one").glob(f"{split}-*.pt")), weights_only=True)
        b = torch.load(next((tmp_path / "two").glob(f"{split}-*.pt")), weights_only=True)
        assert torch.equal(a["labels"], b["labels"])
        for k in a["feats"]:
            assert torch.allclose(a["feats"][k], b["feats"][k], atol=1e-5), k
    r1 = json.loads(next((tmp_path / "o1").glob("*/eval.json")).read_text())
    r2 = json.loads(next((tmp_path / "o2").glob("*/eval.json")).read_text())
    assert r1["results"] == r2["results"]
