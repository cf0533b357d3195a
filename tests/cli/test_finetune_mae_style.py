"""resdecay finetune as facebookresearch/mae fine-tunes and probes (issue 34, item 2): --from any
pretrained format in one step, the test split measured every epoch (split across torchrun ranks),
the best epoch kept as best.pt, and eval-classifier giving the number the run printed."""

import argparse
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from helpers import assert_one_line_error, free_port, run
from helpers.interop import authors_unet_layout
from resdecay.commands.finetune import build_config, load_pretrained
from resdecay.eval.classifier_eval import evaluate_classifier
from resdecay.interop.hf_vitmae import export_to_vitmae
from resdecay.io import file_sha256
from resdecay.train import checkpoint as ckpt

# a few seconds a run: 256 training images (4 steps an epoch), the 360 test images measured every epoch;
# lr high enough, and no mixup, that the accuracy moves from epoch to epoch
QUICK = ["train.batch_size=64", "data.train_subset=256", "train.warmup_epochs=0", "train.lr=3e-3", "mixup=0", "cutmix=0",
         "drop_path=0", "train.ckpt_every=4", "train.keep_last=5", "--no-progress"]
HEADS = ["--import-override", "model.num_heads=2", "--import-override", "model.decoder_num_heads=2"]


def eval_rows(out):
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if "eval_top1" in line]


def printed(text, what="finetune"):
    """(top-1, top-5) of the closing line a command printed."""
    m = re.search(rf"{what}: test top-1 ([0-9.]+), top-5 ([0-9.]+)", text)
    return float(m[1]), float(m[2])


def test_from_detects_every_format_and_imports_it_in_memory(tiny_checkpoints, tmp_path, capsys):
    plain, decayed = (ckpt.load_checkpoint(tiny_checkpoints[k]) for k in ("plain", "decayed"))
    # an official MAE checkpoint (main_pretrain.py's layout), the authors' U-Net MAE, a ViTMAE folder
    torch.save({"model": plain["model"], "epoch": 1, "args": argparse.Namespace(mask_ratio=0.75, norm_pix_loss=False)},
               tmp_path / "mae.pth")
    torch.save({"model": authors_unet_layout(decayed["model"]), "args": argparse.Namespace(min_decay=0.6)}, tmp_path / "unet.pth")
    export_to_vitmae(tiny_checkpoints["plain"], tmp_path / "hf")
    run_folder = ckpt.Path(tiny_checkpoints["plain"]).parent.parent
    cases = {"mae": (tmp_path / "mae.pth", plain, "mae-tiny-digits-plain"),
             "unet-mae": (tmp_path / "unet.pth", decayed, "mae-tiny-digits"),
             "hf-vitmae": (tmp_path / "hf", plain, "mae-tiny-digits-plain"),
             "resdecay": (run_folder, plain, None)}
    for fmt, (path, source, preset) in cases.items():
        overrides = ["model.num_heads=2", "model.decoder_num_heads=2"] if preset else None
        got = load_pretrained(path, import_preset=preset, import_overrides=overrides)
        assert got.format == fmt, path
        for k, v in source["model"].items():  # the same network, weight for weight
            assert torch.allclose(got.state["model"][k], v, atol=1e-6), (fmt, k)
        assert got.state["config"]["model"]["alpha_min"] == source["config"]["model"]["alpha_min"]
        assert got.record()["sha256"] == file_sha256(got.weights_file) and got.record()["format"] == fmt
    assert load_pretrained(run_folder).path == ckpt.Path(tiny_checkpoints["plain"])  # a run folder: its newest checkpoint
    assert load_pretrained(tmp_path / "hf", import_preset="mae-tiny-digits-plain").weights_file.name == "model.safetensors"

    base = ["finetune", "--from", str(tmp_path / "mae.pth"), "train.epochs=1", *QUICK]
    assert_one_line_error(*run(capsys, *base)[::2], "is a facebookresearch/mae checkpoint", "--import-preset")
    assert_one_line_error(*run(capsys, "finetune", tiny_checkpoints["plain"], "--from", str(tmp_path / "mae.pth"))[::2],
                          "give the pretrained model once")
    assert_one_line_error(*run(capsys, "finetune", "--from", tiny_checkpoints["plain"], "--import-preset", "mae-tiny-digits",
                               "--no-progress")[::2], "--import-preset applies to imports")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    assert_one_line_error(*run(capsys, "finetune", "--from", str(tmp_path / "junk.pt"))[::2], "junk.pt")


def test_finetune_from_an_official_mae_file_is_the_run_from_its_resdecay_checkpoint(tiny_checkpoints, tmp_path, capsys):
    """The import is exact, so fine-tuning from the .pth trains the same classifier as from the checkpoint."""
    state = ckpt.load_checkpoint(tiny_checkpoints["plain"])
    torch.save({"model": state["model"], "args": argparse.Namespace(mask_ratio=0.75, norm_pix_loss=False)}, tmp_path / "mae.pth")
    code, out_a, err = run(capsys, "finetune", "--from", str(tmp_path / "mae.pth"), "--import-preset", "mae-tiny-digits-plain",
                           *HEADS, "train.epochs=1", *QUICK, "--out", str(tmp_path / "a"))
    assert code == 0, err
    code, out_b, err = run(capsys, "finetune", tiny_checkpoints["plain"], "train.epochs=1", *QUICK, "--out", str(tmp_path / "b"))
    assert code == 0, err
    assert printed(out_a) == printed(out_b)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["pretrained"]["format"] == "mae" and summary["pretrained"]["path"] == str(tmp_path / "mae.pth")
    assert summary["pretrained"]["sha256"] == file_sha256(tmp_path / "mae.pth")
    assert summary["pretrained"]["stated_by_file"]["mask_ratio"].startswith("0.75")
    card = json.loads((tmp_path / "a" / "eval.json").read_text())["results"][0]["protocol"]
    assert card["pretrained_format"] == "mae" and card["pretrained_sha256"] == summary["pretrained"]["sha256"]
    wa, wb = (ckpt.load_checkpoint(ckpt.list_checkpoints(tmp_path / n / "checkpoints")[-1])["model"] for n in "ab")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_data_path_given_as_key_value_is_where_an_imported_model_fine_tunes(tiny_checkpoints, fake_imagefolder, tmp_path):
    """A weights file says nothing of where its data lives (mae-b16-plain: an ImageFolder without a path), so
    ``finetune --from FILE --import-preset P data.path=DIR`` must read the test split (which sets num_classes)
    from DIR: the key=value overrides win over the imported config, as everywhere, and as --import-override does."""
    state = ckpt.load_checkpoint(tiny_checkpoints["plain"])
    torch.save({"model": state["model"], "args": argparse.Namespace(mask_ratio=0.75, norm_pix_loss=False)}, tmp_path / "mae.pth")
    pretrained = load_pretrained(tmp_path / "mae.pth", import_preset="mae-b16-plain",
                                 import_overrides=["model.num_heads=2", "model.decoder_num_heads=2"])
    assert pretrained.state["config"]["data"]["path"] is None  # nothing said where the data is
    cfg, _ = build_config(pretrained, "finetune-mae", [f"data.path={fake_imagefolder}", "train.epochs=1"])
    assert cfg.data.name == "imagefolder" and cfg.data.path == str(fake_imagefolder)
    assert cfg.model.num_classes == 2  # the folder's cat and dog


def test_every_epoch_is_measured_the_best_kept_and_a_resumed_run_keeps_it(tiny_checkpoints, tmp_path, capsys):
    code, text, err = run(capsys, "finetune", tiny_checkpoints["decayed"], "train.epochs=3", *QUICK, "--out", str(tmp_path / "a"))
    assert code == 0, err
    rows = eval_rows(tmp_path / "a")
    assert [r["epoch"] for r in rows] == [1.0, 2.0, 3.0] and all(r["eval_images"] == 360 for r in rows)
    assert rows[0]["eval_protocol"]["split"] == "test" and rows[0]["eval_protocol"]["augmentation"].startswith("none")
    assert len(re.findall(r"epoch \d: test top-1", text)) == 3
    best = max(rows, key=lambda r: (r["eval_top1"], -r["epoch"]))  # the first epoch wins a tie
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert (summary["best_top1"], summary["best_epoch"]) == (best["eval_top1"], int(best["epoch"]))
    assert summary["final_top1"] == rows[-1]["eval_top1"] and f"{rows[-1]['eval_top1']:.4f}" == f"{printed(text)[0]:.4f}"
    best_pt = tmp_path / "a" / "checkpoints" / "best.pt"
    saved = ckpt.load_checkpoint(best_pt)
    assert saved["train_state"]["step"] == best["step"] and saved["best"]["top1"] == best["eval_top1"]
    assert evaluate_classifier(best_pt, progress=False)["values"]["top1"] == best["eval_top1"]  # best.pt holds that epoch

    # a run interrupted after epoch 2 and resumed measures epoch 3 only, yet keeps the best of all three
    step_8 = ckpt.checkpoint_path(tmp_path / "a" / "checkpoints", 8)
    code, text, err = run(capsys, "finetune", tiny_checkpoints["decayed"], "train.epochs=3", *QUICK, "--out", str(tmp_path / "a"),
                          "--resume", str(step_8))
    assert code == 0, err
    assert len(re.findall(r"epoch \d: test top-1", text)) == 1
    assert eval_rows(tmp_path / "a") == rows  # the same epochs, the same numbers
    resumed = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert (resumed["best_top1"], resumed["best_epoch"]) == (summary["best_top1"], summary["best_epoch"])
    assert ckpt.load_checkpoint(best_pt)["train_state"]["step"] == best["step"]


def test_eval_classifier_prints_the_number_the_run_printed(tiny_checkpoints, tmp_path, capsys):
    code, text, err = run(capsys, "finetune", tiny_checkpoints["decayed"], "--preset", "linprobe-mae", "train.epochs=2",
                          *QUICK, "train.lr=0.1", "--out", str(tmp_path / "lp"))
    assert code == 0, err
    final = ckpt.list_checkpoints(tmp_path / "lp" / "checkpoints")[-1]
    code, out, err = run(capsys, "eval-classifier", str(final), "--no-progress", "--out", str(tmp_path / "e.json"))
    assert code == 0, err
    assert f"{printed(out, 'eval-classifier')[0]:.4f}" == f"{printed(text, 'linprobe')[0]:.4f}"
    report = json.loads((tmp_path / "e.json").read_text())
    assert report["values"]["top1"] == json.loads((tmp_path / "lp" / "summary.json").read_text())["final_top1"]
    assert report["correct"]["top1"] == round(report["values"]["top1"] * 360) and report["protocol"]["images"] == 360
    assert report["checkpoint_sha256"] == file_sha256(final)
    assert_one_line_error(*run(capsys, "eval-classifier", tiny_checkpoints["decayed"])[::2], "holds a 'mae' model", "resdecay eval")
    assert_one_line_error(*run(capsys, "eval-classifier", str(tmp_path / "lp"))[::2], "is a folder", "best.pt")


@pytest.mark.slow
def test_torchrun_splits_the_evaluation_and_equals_one_process(tiny_checkpoints, tmp_path):
    """MAE's --dist_eval: each of 2 ranks (gloo, CPU) measures its share, the counts are summed; the logged
    numbers equal a one-process evaluation of the checkpoints the run saved."""
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "resdecay", "finetune", tiny_checkpoints["decayed"], "train.epochs=2", *QUICK, "train.batch_size=32",
           "train.device=cpu", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("finetune: test top-1") == 1 and proc.stdout.count("epoch 2: test top-1") == 1  # rank 0 alone
    rows = eval_rows(out)
    assert [r["eval_protocol"]["processes"] for r in rows] == [2, 2] and all(r["eval_images"] == 360 for r in rows)
    final = evaluate_classifier(ckpt.list_checkpoints(out / "checkpoints")[-1], device="cpu", progress=False)
    assert (final["values"]["top1"], final["values"]["top5"]) == (rows[-1]["eval_top1"], rows[-1]["eval_top5"])
    best = evaluate_classifier(out / "checkpoints" / "best.pt", device="cpu", progress=False)
    summary = json.loads((out / "summary.json").read_text())
    assert best["values"]["top1"] == summary["best_top1"] and final["protocol"]["processes"] == 1
