"""The command line as a user meets it: smoke runs, and every bad input as one clear line (exit 2)."""

import json
import os

import pytest

from helpers import TINY, assert_one_line_error, model_overrides, run
from resdecay.train import checkpoint as ckpt


def test_alpha_prints_table_and_plot(capsys, tmp_path):
    png = tmp_path / "a.png"
    code, out, _ = run(capsys, "alpha", "--depth", "24", "--alpha-min", "0.7", "--out", str(png))
    assert code == 0 and png.stat().st_size > 1000
    assert "alpha_eff = 3.149e-04" in out and out.count("\n") >= 25
    code, out, err = run(capsys, "alpha", "--depth", "24", "--target-eff", "5e-3", "--json", "--out", str(png))
    assert code == 0
    line = err.splitlines()[0]  # with --json, messages go to stderr and stdout is the JSON alone
    assert line.startswith("alpha_min 0.795") and "alpha_eff 0.005" in line
    data = json.loads(out)
    assert data["alpha_eff"] == pytest.approx(5e-3) and len(data["alphas"]) == 24


def test_presets_lists_all(capsys):
    code, out, _ = run(capsys, "presets")
    assert code == 0 and "mae-b16-plain" in out and "mae-tiny-digits" in out


def test_pretrain_smoke_and_print_config(capsys, tmp_path):
    code, out, _ = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--print-config", "alpha_min=0.7")
    assert code == 0 and "alpha_min: 0.7" in out
    code, out, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *TINY, "train.epochs=1",
                         f"train.out_dir={tmp_path / 'r'}")
    assert code == 0, err
    assert "effective batch 64" in out and "lr 3.75e-04" in out and "done: 22 steps" in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] == 22 and os.path.exists(summary["checkpoint"])


def test_out_names_the_run_folder_of_every_training_command(capsys, tmp_path):
    """``--out DIR`` is train.out_dir=DIR, as ``--out`` is the output folder of every other command."""
    code, out, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--print-config", "--out", "runs/my run: 1e3")
    assert code == 0, err
    assert "out_dir: 'runs/my run: 1e3'" in out or 'out_dir: "runs/my run: 1e3"' in out  # a string, whatever it looks like
    code, out, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--no-progress", *TINY, "train.epochs=1",
                         "data.train_subset=256", "--out", str(tmp_path / "r"))  # 4 steps: a finished run is what is read
    assert code == 0, err
    assert (tmp_path / "r" / "summary.json").exists()
    for cmd in (["pretrain", "--preset", "mae-tiny-digits"], ["train-supervised", "--preset", "resnet18-fmnist"],
                ["finetune", str(tmp_path / "missing.pt")]):
        code, _, err = run(capsys, *cmd, "--out", "a", "train.out_dir=b")
        assert_one_line_error(code, err, "--out DIR or train.out_dir=DIR, not both")


@pytest.mark.slow
def test_demo_smoke(capsys, tmp_path, monkeypatch):
    from resdecay.commands import demo

    # the digits recipe on the tests' tiny MAE (4 blocks of 32, not 12 of 64): the demo's steps, files and printout
    # are what is checked, not its numbers
    preset, extra, alpha = demo.DEMO_DATA["digits"]
    monkeypatch.setitem(demo.DEMO_DATA, "digits", (preset, [*extra, *model_overrides("mae")], alpha))
    code, out, err = run(capsys, "demo", "--data", "digits", "--epochs", "1", "--out", str(tmp_path / "demo"), "--no-progress")
    assert code == 0, err
    res = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert len(res["results"]) == 2
    for r in res["results"].values():
        assert 0 <= r["knn_top1"] <= 1 and r["effective_rank_cls"] >= 0 and r["protocol"]["knn"]["k"] == 20
    for png in ("loss_curves.png", "alpha_schedule.png", "reconstructions.png", "pca_maps.png"):
        assert (tmp_path / "demo" / png).stat().st_size > 1000
    assert "kNN top-1" in out and "plain MAE" in out and "alpha_min 0.6" in out
    assert "What this demo shows:" in out and "What it does not show" in out and "docs/RESULTS.md" in out


@pytest.mark.slow
def test_demo_side_by_side_gives_the_numbers_of_one_after_the_other(tmp_path, monkeypatch):
    """The fashion-mnist-m demo trains its two models in parallel processes, 1 thread each; that must change
    the wall time only: the same rows as training them one after the other with --threads 1."""
    from resdecay.commands import demo
    from resdecay.viz import diagnostics_figures

    rows = {}
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)  # side by side needs a core per model
    # the digits demo on the tests' tiny model (4 blocks of width 32, not 12 of 64) and 512 training digits: what is
    # compared is how the two models are trained (one process after the other, or side by side), which no size changes
    preset, extra, alpha = demo.DEMO_DATA["digits"]
    monkeypatch.setitem(demo.DEMO_DATA, "digits", (preset, [*extra, *model_overrides("mae"), "data.train_subset=512"], alpha))
    # the PNGs are test_demo_smoke's: drawn here they would be drawn twice more and never looked at (the diagnostics'
    # numbers are still computed; only their figure is not drawn)
    monkeypatch.setattr(demo, "write_figures", lambda out, models, logs, data_name: [])
    monkeypatch.setattr(diagnostics_figures, "plot_diagnostics", lambda reports, path, note="": path)
    for mode, side in (("seq", set()), ("par", {"digits"})):
        monkeypatch.setattr(demo, "SIDE_BY_SIDE", side)
        report = demo.run_demo("digits", str(tmp_path / mode), epochs=1, progress=False, threads=1)
        assert report["demo"]["side_by_side"] == bool(side)
        rows[mode] = {label: (r["knn_top1"], r["final_loss"], r["effective_rank_cls"]) for label, r in report["results"].items()}
    assert rows["seq"] == rows["par"] and len(rows["par"]) == 2


def test_demo_side_by_side_bad_out_is_one_line(capsys, tmp_path, monkeypatch):
    """A side-by-side demo with an unwritable --out is one line (exit 2) naming --out, the option the demo's user
    typed (since issue 30.9 it is refused before the two processes start)."""
    from resdecay.commands import demo

    monkeypatch.setattr(demo, "SIDE_BY_SIDE", {"digits"})
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 2)
    (tmp_path / "file").write_text("not a folder")
    code, _, err = run(capsys, "demo", "--data", "digits", "--epochs", "1", "--out", str(tmp_path / "file" / "demo"), "--no-progress")
    assert_one_line_error(code, err, "is not writable", "pass --out DIR")


def test_demo_closing_note_follows_the_numbers():
    from resdecay.commands.demo import closing_note

    def res(knn, rank):
        return {"knn_top1": knn, "effective_rank_cls": rank}

    note = closing_note({"plain MAE": res(0.70, 1.7), "U-Net MAE": res(0.36, 0.2)})
    assert "0.20 decayed vs 1.70 plain: lower, as the paper reports" in note
    assert "the decayed encoder is worse" in note
    flipped = closing_note({"plain MAE": res(0.30, 0.2), "U-Net MAE": res(0.50, 1.0)})
    assert "NOT lower this time" in flipped and "the decayed encoder is better here" in flipped


@pytest.mark.parametrize("args,fragments", [
    (["pretrain", "--preset", "mae-tiny-digits", "alpha_min=1.5"], ["alpha_min must lie in (0, 1]"]),
    (["pretrain", "--preset", "mae-tiny-digits", "alpha_min=0"], ["alpha_min must lie in (0, 1]"]),
    (["alpha", "--depth", "12", "--alpha-min", "0"], ["alpha_min must lie in (0, 1]"]),
    (["pretrain", "--preset", "mae-tiny-digits", "train.norm_growth_warn=-1"], ["train.norm_growth_warn must be >= 0"]),
    (["pretrain", "--preset", "mae-tiny-digits", "train.norm_growth_window=0"], ["train.norm_growth_window >= 1"]),
    (["pretrain", "--preset", "sit-tiny-fmnist", "model.gelu=relu"], ["model.gelu", "tanh"]),
    (["pretrain", "--preset", "mae-tiny-digits", "data.decoder=dali"], ["data.decoder=dali decodes ImageFolder"]),
    (["alpha", "--depth", "12", "--target-eff", "3"], ["unreachable"]),
    (["demo", "--alpha-min", "2"], ["--alpha-min must lie in (0, 1]"]),
    (["pretrain", "--preset", "mae-giant"], ["preset 'mae-giant' does not exist", "mae-b16"]),
    (["pretrain", "--preset", "mae-tiny-digits", "alpha_mn=0.6"], ["'alpha_mn' is not a setting", "model.alpha_min"]),
    (["pretrain", "--preset", "mae-tiny-digits", "train.batch_size=0"], ["train.batch_size must be a positive integer"]),
    (["pretrain", "--preset", "mae-tiny-digits", "train.batch_size=-8"], ["train.batch_size must be a positive integer"]),
    (["pretrain", "--preset", "mae-tiny-digits", "train.epochs=0"], ["train.epochs must be a positive integer"]),
    (["pretrain", "--preset", "mae-tiny-digits", "train.epochs=-1"], ["train.epochs must be a positive integer"]),
    (["demo", "--epochs", "0"], ["--epochs must be a positive integer"]),
    (["demo", "--threads", "0"], ["--threads must be a positive integer"]),  # issue 23.11's new option
    (["demo", "--diffusion", "--threads", "2"], ["--threads is an option of the MAE demo", "OMP_NUM_THREADS"]),
    (["pretrain", "--preset", "mae-tiny-digits", "model.patch_size=3"], ["not divisible by patch size 3", "[1, 2, 4, 8]"]),
])
def test_bad_input_is_one_line_exit_2(capsys, args, fragments):
    assert_one_line_error(*run(capsys, *args)[::2], *fragments)


def test_bad_data_paths(capsys, tmp_path, fake_imagefolder):
    base = ["pretrain", "--preset", "mae-tiny-digits", "--no-progress", *TINY, f"train.out_dir={tmp_path / 'o'}"]
    code, _, err = run(capsys, *base, "data.name=fashion-mnist", f"data.path={tmp_path / 'missing'}",
                       "model.img_size=28", "model.patch_size=4")
    assert_one_line_error(code, err, "does not exist")
    (tmp_path / "empty" / "train" / "a").mkdir(parents=True)
    rgb = ["model.img_size=32", "model.patch_size=4", "model.in_chans=3"]
    code, _, err = run(capsys, *base, "data.name=imagefolder", f"data.path={tmp_path / 'empty'}", *rgb)
    assert_one_line_error(code, err, "holds no images")
    # an unreadable image in the middle of the data, read by a DataLoader worker process
    (fake_imagefolder / "train" / "dog" / "3.png").write_bytes(b"\x89PNG broken")
    code, _, err = run(capsys, *base, "data.name=imagefolder", f"data.path={fake_imagefolder}", "data.num_workers=2",
                       "train.batch_size=4", *rgb)
    assert_one_line_error(code, err, "cannot read image", "dog/3.png")
    # fixed-size images that do not match the model (no silent resize)
    code, _, err = run(capsys, *base, "data.name=digits", "model.img_size=28", "model.patch_size=4")
    assert_one_line_error(code, err, "digits images are 8x8 but model.img_size is 28")


def test_resume_mismatch_and_unwritable_out(capsys, tmp_path):
    base = ["pretrain", "--preset", "mae-tiny-digits", "--no-progress", *TINY, "train.epochs=1", "data.train_subset=256",
            f"train.out_dir={tmp_path / 'r'}"]  # 4 steps: what is resumed is a finished run's checkpoint
    assert run(capsys, *base)[0] == 0
    kept = ckpt.list_checkpoints(tmp_path / "r" / "checkpoints")
    before = kept[-1].read_bytes()
    code, _, err = run(capsys, *base, "alpha_min=0.7", "--resume", "auto")
    assert_one_line_error(code, err, "different model", "model.alpha_min: checkpoint 0.6 vs run 0.7")
    code, _, err = run(capsys, *base, "model.depth=2", "--resume", str(kept[-1]))
    assert_one_line_error(code, err, "different model", "model.depth")
    assert kept[-1].read_bytes() == before  # nothing lost
    code, _, err = run(capsys, *base, "--resume", str(tmp_path / "nope.pt"))
    assert_one_line_error(code, err, "no such checkpoint")
    (tmp_path / "afile").write_text("x")
    code, _, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", f"train.out_dir={tmp_path / 'afile' / 'run'}")
    assert_one_line_error(code, err, "is not writable", "train.out_dir=")


def test_demo_fashion_mnist_m_reruns_the_where_map_cell_where_the_decay_won():
    from resdecay.commands.ablate import load_grid
    from resdecay.commands.demo import DEMO_DATA, closing_note

    preset, extra, alpha = DEMO_DATA["fashion-mnist-m"]
    grid = load_grid("where-map")  # the cell RESULTS §14 measured over three seeds, minus checkpoint / online-eval cadence
    cadence = [o for o in grid["overrides"] if o.startswith(("train.ckpt_every", "train.online_eval"))]
    assert preset == grid["preset"] and extra == [o for o in grid["overrides"] if o not in cadence] and alpha == 0.8
    assert "train.epochs=32" in extra and "model.patch_size=8" in extra and cadence[0] not in extra
    assert "alpha_min=0.8" in grid["variants"][1]["overrides"]
    note = closing_note({"plain MAE": {"knn_top1": 0.158, "effective_rank_cls": 2.1},
                         "U-Net MAE": {"knn_top1": 0.231, "effective_rank_cls": 1.7}}, "fashion-mnist-m")
    assert "--data fashion-mnist-m" in note and "the decayed encoder is better here" in note


def test_demo_fashion_mnist_m_without_the_idx_files_is_one_line(capsys, monkeypatch):
    import resdecay.commands.demo as demo

    monkeypatch.setattr(demo, "fashion_mnist_available", lambda *a: False)
    code, out, err = run(capsys, "demo", "--data", "fashion-mnist-m", "--no-progress")
    assert_one_line_error(code, err, "--data fashion-mnist-m", "apt-get install dataset-fashion-mnist")


def test_demo_closing_note_states_the_seed_spread():
    """Issue 23.11: every demo number is printed beside how much it moves over seeds (and threads)."""
    from resdecay.commands.demo import DEMO_DATA, closing_note

    res = {"plain MAE": {"knn_top1": 0.69, "effective_rank_cls": 1.7}, "U-Net MAE": {"knn_top1": 0.32, "effective_rank_cls": 0.2}}
    for data in DEMO_DATA:
        note = closing_note(res, data)
        assert "- Spread over seeds" in note, data
    assert "0.331 +/- 0.022" in closing_note(res, "digits") and "--threads 1" in closing_note(res, "digits")
    assert "not measured for this setting" in closing_note(res, "")
