"""Fashion-MNIST-M (garments on photographic backgrounds), the pixel / random-init baselines and
the 'where does the decay help?' grids."""

import json

import pytest
import torch

from helpers import TINY, assert_one_line_error, run
from resdecay.commands.ablate import load_grid, run_grid
from resdecay.data import DataConfig, build_dataset
from resdecay.data.fashion_mnist_m import composite
from resdecay.data.subsets import balanced_indices
from resdecay.eval.features.baselines import baseline_value, random_init_model


def _square_garments(n=6):
    """White squares: the garment's opacity is 1 inside and 0 outside, so its footprint is known."""
    g = torch.zeros(n, 1, 28, 28, dtype=torch.uint8)
    g[:, :, 6:22, 6:22] = 255
    return g


def test_same_index_same_image_and_slices_agree():
    g = _square_garments(8)
    a = composite(g, "train", 32, seed=3)
    assert a.shape == (8, 3, 32, 32) and a.dtype == torch.uint8
    assert torch.equal(a, composite(g, "train", 32, seed=3))
    assert torch.equal(a[5:], composite(g[5:], "train", 32, seed=3, offset=5))  # image i depends on i alone
    assert not torch.equal(a, composite(g, "train", 32, seed=4))
    assert not torch.equal(a, composite(g, "test", 32, seed=3))


def test_each_nuisance_changes_what_it_should_and_nothing_else():
    g = _square_garments()
    all_on = composite(g, "train", 32)
    bare = composite(g, "train", 32, nuisances=())
    footprint = bare.sum(1) > 0  # where the (white, centred, fixed-size) garment has any opacity
    core = (bare == 255).all(1)  # where it is fully opaque
    # nothing on: the same centred white square on black in every image
    assert torch.equal(footprint, footprint[:1].expand_as(footprint)) and core[0].any()
    ys, xs = torch.nonzero(footprint[0], as_tuple=True)
    assert float(ys.float().mean()) == pytest.approx(15.5, abs=0.6) and float(xs.float().mean()) == pytest.approx(15.5, abs=0.6)
    # background only: the opaque garment unchanged, everything outside it a photograph
    bg = composite(g, "train", 32, nuisances=("background",))
    assert torch.equal(bg.permute(1, 0, 2, 3)[:, core], bare.permute(1, 0, 2, 3)[:, core])
    assert bg.permute(1, 0, 2, 3)[:, ~footprint].float().std() > 10
    # colour only: same footprint, grey becomes a colour (channels differ), background stays black
    col = composite(g, "train", 32, nuisances=("colour",))
    assert torch.equal(col.sum(1) > 0, footprint)
    assert (col[:, 0] != col[:, 1]).any() or (col[:, 1] != col[:, 2]).any()
    # scale only: footprints of different sizes, still centred
    sc = composite(g, "train", 32, nuisances=("scale",)).sum(1) > 0
    assert len({int(m.sum()) for m in sc}) > 1
    # position only: same size as bare, different places
    pos = composite(g, "train", 32, nuisances=("position",)).sum(1) > 0
    assert {int(m.sum()) for m in pos} == {int(footprint[0].sum())} and not torch.equal(pos, footprint)
    # switching colour off leaves the background and placement draws of every image untouched
    no_colour = composite(g, "train", 32, nuisances=("background", "scale", "position"))
    outside = (composite(g, "train", 32, nuisances=("scale", "position")).sum(1) == 0)
    assert torch.equal(no_colour.permute(1, 0, 2, 3)[:, outside], all_on.permute(1, 0, 2, 3)[:, outside])


def test_the_textures_generator_is_another_draw_with_the_same_switches():
    g = _square_garments()
    tex = composite(g, "train", 32, composition="textures")
    assert torch.equal(tex, composite(g, "train", 32, composition="textures"))  # image i depends on i alone
    assert torch.equal(tex[3:], composite(g[3:], "train", 32, offset=3, composition="textures"))
    assert not torch.equal(tex, composite(g, "train", 32))  # not the photographs' images
    # every switch off: the two generators make the same centred white square on black
    assert torch.equal(composite(g, "train", 32, nuisances=(), composition="textures"), composite(g, "train", 32, nuisances=()))
    # background only: a textured background (not black) around the unchanged garment
    bare, bg = composite(g, "train", 32, nuisances=()), composite(g, "train", 32, nuisances=("background",), composition="textures")
    core, outside = (bare == 255).all(1), bare.sum(1) == 0
    assert torch.equal(bg.permute(1, 0, 2, 3)[:, core], bare.permute(1, 0, 2, 3)[:, core])
    assert bg.permute(1, 0, 2, 3)[:, outside].float().std() > 10
    # milder: pastel garments (every channel >= 128 inside the opaque core), larger ones (>= 5/8 of the canvas)
    col = composite(g, "train", 32, nuisances=("colour",), composition="textures").permute(1, 0, 2, 3)[:, core]
    assert int(col.min()) >= 128
    side = (composite(_garment_frames(), "train", 32, nuisances=("scale",), composition="textures").sum(1) > 0)
    assert min(int(m.any(0).sum()) for m in side) >= 20 and len({int(m.sum()) for m in side}) > 1


def _garment_frames(n=6):
    """Garments whose opacity covers the whole 28 x 28 frame, so a footprint's side is the pasted size."""
    return torch.full((n, 1, 28, 28), 255, dtype=torch.uint8)


def test_a_checkpoint_measured_on_other_fashion_mnist_m_images_is_not_read_from_the_cache(fake_fmnist, tmp_path, capsys):
    """The generator's knobs (nuisances, canvas, seed, composition) are in the card and the cache key: a run trained
    on clean composites, measured on its own images and then on ``--data fashion-mnist-m`` (every nuisance on), is
    extracted twice -- it once read the clean features back for the second."""
    from resdecay.train import train
    from resdecay.train.config import load_config

    cfg = load_config("mae-tiny-fmnistm", [*TINY, "train.epochs=1", "train.batch_size=48", "data.nuisances=[]",
                                           f"data.path={fake_fmnist}", f"train.out_dir={tmp_path / 'run'}"])
    ckpt = train(cfg, progress=False)["checkpoint"]
    common = ["--evals", "knn", "--no-baselines", "--no-progress", "--cache-dir", tmp_path / "cache"]
    code, _, err = run(capsys, "eval", ckpt, *common, "--out", tmp_path / "own")
    assert code == 0, err
    code, out, err = run(capsys, "eval", ckpt, "--data", "fashion-mnist-m", "--data-path", fake_fmnist, *common,
                         "--out", tmp_path / "all")
    assert code == 0, err
    assert "train new, test new" in out
    cards = [json.loads(next((tmp_path / f).rglob("eval.json")).read_text())["results"][0]["protocol"]["train"]["generator"]
             for f in ("own", "all")]
    assert cards == [{"canvas": 32, "nuisances": [], "dataset_seed": 0, "composition": "photos"},
                     {"canvas": 32, "nuisances": ["background", "colour", "scale", "position"], "dataset_seed": 0,
                      "composition": "photos"}]


@pytest.mark.slow
def test_splits_come_from_their_own_garments(fake_fmnist):
    """Train images are made from the train IDX file's garments and test images from the test file's."""
    from resdecay.data.datasets import _load_fashion_mnist

    cfg = DataConfig(name="fashion-mnist-m", path=str(fake_fmnist), nuisances=[])
    for split, n in (("train", 96), ("test", 32)):
        ds, info = build_dataset(cfg, split, 32)
        garments, labels = _load_fashion_mnist(str(fake_fmnist), split == "train")
        assert len(ds) == n and info.in_chans == 3 and info.num_classes == 10
        assert torch.equal(ds.images, composite(garments, split, 32, nuisances=()))
        assert torch.equal(ds.labels, labels)
    ds, _ = build_dataset(DataConfig(name="fashion-mnist-m", path=str(fake_fmnist), train_subset=10), "train", 32)
    full, _ = build_dataset(DataConfig(name="fashion-mnist-m", path=str(fake_fmnist)), "train", 32)
    chosen = balanced_indices(full.labels, 10)  # the class-balanced draw every subset takes (issue 30.1)
    assert torch.equal(ds.images, full.images[chosen])  # a subset holds the whole split's images, not other images


@pytest.mark.parametrize("override,fragment", [
    ("data.canvas=8", "data.canvas must be an integer from 16 to 128"),
    ("data.nuisances=[background,rain]", "data.nuisances: 'rain' is unknown"),
    ("data.nuisances=[colour,colour]", "lists a nuisance twice"),
    ("data.composition=paintings", "data.composition"),
])
def test_bad_knobs_are_one_line(capsys, tmp_path, override, fragment):
    code, _, err = run(capsys, "pretrain", "--preset", "mae-tiny-fmnistm", override, f"train.out_dir={tmp_path}")
    assert_one_line_error(code, err, fragment)


@pytest.mark.slow
def test_baselines_in_eval_json_with_protocol_cards(tiny_checkpoints, tmp_path, capsys):
    code, text, err = run(capsys, "eval", tiny_checkpoints["decayed"], "--probe-epochs", "3", "--no-progress",
                          "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out"))
    assert code == 0, err
    rep = json.loads(next((tmp_path / "out").rglob("eval.json")).read_text())
    got = {(r["source"], r["metric"], r["feature"]) for r in rep["baselines"]}
    assert got == {("pixels", "knn", "pixels"), ("pixels", "probe", "pixels"), ("pixels", "rank", "pixels"),
                   ("random-init", "knn", "mean"), ("random-init", "probe", "mean"),
                   ("random-init", "rank", "mean"), ("random-init", "rank", "cls")}
    for r in rep["baselines"]:
        p = r["protocol"]
        assert p["source"] == r["source"] and p["train"]["images"] == 1437 and p["test"]["images"] == 360
    knn_px = baseline_value(rep, "pixels", "knn", "pixels", "top1")
    assert 0.8 < knn_px <= 1.0  # digits pixels are already very separable
    assert "baselines (same protocol)" in text and "random-init" in text
    assert code == 0 and "pixels" in text


def test_random_init_baseline_is_the_runs_first_weights(tmp_path):
    """The random encoder is seeded as train() seeds it: the weights train() starts from."""
    from resdecay.train import train
    from resdecay.train.config import load_config

    cfg = load_config("mae-tiny-digits", [*TINY, "train.epochs=1", "data.train_subset=64", f"train.out_dir={tmp_path / 'r'}"])
    first = {}
    train(cfg, progress=False, init=lambda m: first.update({k: v.clone() for k, v in m.state_dict().items()}))
    ref = random_init_model(cfg).state_dict()
    assert first.keys() == ref.keys() and all(torch.equal(v, ref[k]) for k, v in first.items())


@pytest.mark.slow
def test_where_grids_load_and_one_cell_runs(fake_fmnist, tmp_path, capsys):
    for name in ("where-fmnistm", "where-fmnistm-long", "where-fmnist-long"):
        assert load_grid(name)["variants"]
    extra = [*TINY, "train.epochs=1", "train.batch_size=32", "data.train_subset=32", f"data.path={fake_fmnist}",
             "data.num_workers=0", "train.online_eval_every=0"]
    res = run_grid("where-fmnistm", out=str(tmp_path / "g"), only=["plain MAE"], extra=extra, progress=False)
    row = res["rows"]["plain MAE"]
    assert set(row["measures"]) == {"knn_top1", "probe_top1", "rank_cls"} and row["random_init"]
    assert res["pixels"]["knn_top1"] is not None
    assert "raw pixels (no model)" in capsys.readouterr().out
