"""Images with label maps for the segmentation metric: Fashion-MNIST-M's compositor masks, and the
COCO-Stuff-27 (STEGO / PiCIE curated), Pascal VOC and user folder layouts, each written at test time."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.seg_folders import write_seg_folder
from resdecay.data import DataConfig
from resdecay.data.fashion_mnist_m import NUISANCES, composite
from resdecay.data.seg_masks import (
    COCO27_NAMES,
    COCO_CURATED,
    COCO_FINE_TO_27,
    IGNORE,
    VOC_NAMES,
    coco_to_27,
    masked_images,
)
from resdecay.data.subsets import label_map_order
from resdecay.errors import DataError


@pytest.mark.parametrize("nuisances", [[], ["background"], ["background", "colour"], list(NUISANCES)])
def test_fashion_mnist_m_label_maps_mark_the_pasted_garment(fake_fmnist, nuisances):
    from resdecay.data.datasets import _load_fashion_mnist

    garments, labels = _load_fashion_mnist(str(fake_fmnist), False)
    garments, labels = garments[:10], labels[:10]
    garments[:, :, :, :] = 0
    garments[:, :, 4:24, 6:22] = 255  # an opaque rectangle: its pasted place is known exactly
    plain = composite(garments, "test", 32, nuisances, 0)
    images, masks = composite(garments, "test", 32, nuisances, 0, labels=labels)
    assert torch.equal(images, plain)  # asking for masks changes no image
    assert masks.shape == (10, 32, 32) and masks.dtype == torch.uint8
    for i in range(10):
        values = set(masks[i].unique().tolist())
        assert values == {0, int(labels[i]) + 1}  # background and this garment's class + 1
        garment = masks[i] > 0
        # on black with a white garment, a pixel's grey is the garment's opacity: the mask is opacity >= 0.5
        if "colour" not in nuisances and "background" not in nuisances:
            assert (images[i][:, garment] >= 127).all() and (images[i][:, ~garment] <= 128).all()
            assert (images[i][:, garment] == 255).float().mean() > 0.5  # mostly the opaque inside
        if "position" not in nuisances and "scale" not in nuisances:  # 24 px garment centred: rows 4..27
            ys, xs = garment.nonzero(as_tuple=True)
            assert ys.min() >= 4 and ys.max() <= 27 and xs.min() >= 4 and xs.max() <= 27


def test_fashion_mnist_m_masked_images_for_the_metric(fake_fmnist):
    cfg = DataConfig(name="fashion-mnist-m", path=str(fake_fmnist))
    m = masked_images("fashion-mnist-m", cfg, None, 32, 20)
    assert m.images.shape == (20, 3, 32, 32) and m.labels.shape == (20, 32, 32) and m.classes == 11
    assert int(m.labels.max()) <= 10 and m.card["split"] == "test" and m.card["nuisances"] == list(NUISANCES)
    with pytest.raises(DataError, match="model reads 64x64"):
        masked_images("fashion-mnist-m", cfg, None, 64, 20)


def _write_cocostuff(root, sizes=((40, 48), (48, 40), (36, 36)), curated=True):
    rng = np.random.default_rng(0)
    (root / "images" / "val2017").mkdir(parents=True)
    (root / "annotations" / "val2017").mkdir(parents=True)
    ids = [f"0000000{i}" for i in range(len(sizes))]
    fine = []
    for i, (h, w) in zip(ids, sizes, strict=True):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(root / "images" / "val2017" / f"{i}.jpg")
        lab = rng.choice(np.r_[np.arange(182), IGNORE], (h, w)).astype(np.uint8)
        Image.fromarray(lab).save(root / "annotations" / "val2017" / f"{i}.png")
        fine.append(lab)
    if curated:
        (root / "curated" / "val2017").mkdir(parents=True)
        (root / "curated" / "val2017" / COCO_CURATED).write_text("\n".join(ids[::-1]) + "\n")  # listed in reverse
    return ids, fine


def test_coco_fine_to_27_is_the_curated_mapping():
    assert len(COCO_FINE_TO_27) == 182 and set(COCO_FINE_TO_27.tolist()) == set(range(27))
    # spot checks: person -> 9 (things' first id), ... the stuff ids start at 91
    assert coco_to_27(np.array([0, 1, 181, 91, 170, IGNORE], dtype=np.uint8)).tolist() == [9, 11, 24, 17, 18, IGNORE]
    assert (COCO_FINE_TO_27[:91] < 12).all() and (COCO_FINE_TO_27[91:] >= 12).all()  # 12 thing, 15 stuff classes


def test_cocostuff27_folder_is_read_in_list_order_mapped_and_resized(tmp_path):
    ids, fine = _write_cocostuff(tmp_path)
    m = masked_images("cocostuff27", None, str(tmp_path), 32, 100)
    assert m.classes == 27 and m.images.shape == (3, 3, 32, 32) and m.labels.shape == (3, 32, 32)
    assert m.card["chosen"] == f"ids of {COCO_CURATED}" and m.card["images"] == 3
    values = set(m.labels.unique().tolist())
    assert values <= set(range(27)) | {IGNORE} and IGNORE in values
    # the list is reversed: the first image is the last written, 36x36 -> 32x32 by nearest (labels are not blended)
    first = torch.nn.functional.interpolate(torch.from_numpy(coco_to_27(fine[-1]).astype(np.float32))[None, None],
                                            size=(32, 32), mode="nearest")[0, 0].long()
    assert torch.equal(m.labels[0], first)
    two = masked_images("cocostuff27", None, str(tmp_path), 32, 2)  # a class-balanced draw of 2 of the 3 listed ids
    assert two.images.shape[0] == 2 and two.card["chosen"].startswith(f"class-balanced draw of 2 of 3 (ids of {COCO_CURATED})")
    assert m.names == COCO27_NAMES and set(m.card["files"]) == set(ids)


def test_cocostuff27_without_id_list_reads_every_label_map(tmp_path):
    _write_cocostuff(tmp_path, curated=False)
    m = masked_images("cocostuff27", None, str(tmp_path), 16, 100)
    assert m.card["chosen"].startswith("every label map") and len(m.images) == 3


def _write_voc(root, label=None, size=(30, 40), label_size=None):
    rng = np.random.default_rng(1)
    for d in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (root / d).mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(root / "JPEGImages" / "2007_000001.jpg")
    lab = label if label is not None else rng.integers(0, 21, label_size or size).astype(np.uint8)
    lab[0, :] = IGNORE  # VOC's boundary label
    png = Image.fromarray(lab, mode="P")
    png.putpalette([v for i in range(256) for v in (i, 255 - i, (7 * i) % 256)])  # a palette PNG, as VOC ships
    png.save(root / "SegmentationClass" / "2007_000001.png")
    (root / "ImageSets" / "Segmentation" / "val.txt").write_text("2007_000001\n")


def test_voc_folder_palette_indices_are_the_labels(tmp_path):
    _write_voc(tmp_path)
    m = masked_images("voc", None, str(tmp_path), 32, 100)
    assert m.classes == 21 and m.labels.shape == (1, 32, 32) and m.card["norm"] == "ImageNet mean/std"
    assert set(m.labels.unique().tolist()) <= set(range(21)) | {IGNORE}
    assert (m.labels == IGNORE).any()


@pytest.mark.parametrize("make,message", [
    (lambda r: _write_voc(r, label_size=(20, 40)), "is 20x40 but its image 2007_000001.jpg is 30x40"),
    (lambda r: (_write_voc(r, label=np.full((30, 40), 30, dtype=np.uint8)),
                (r / "classes.txt").write_text("\n".join(VOC_NAMES))), "holds label 30 but voc has 21 classes"),
    (lambda r: (_write_voc(r), (r / "classes.txt").write_text("a\n\nb\n")), "classes.txt: line 2 is empty"),
    (lambda r: (r / "JPEGImages").mkdir(), "is not a voc folder: expected JPEGImages/<id>.jpg"),
])
def test_bad_voc_folders_are_one_line(tmp_path, make, message):
    make(tmp_path)
    with pytest.raises(DataError, match=message.replace("(", r"\(")) as e:
        masked_images("voc", None, str(tmp_path), 32, 100)
    assert "\n" not in str(e.value)


def test_listed_but_missing_file_and_data_without_masks(tmp_path):
    ids, _ = _write_cocostuff(tmp_path)
    (tmp_path / "annotations" / "val2017" / f"{ids[1]}.png").unlink()
    with pytest.raises(DataError, match="is listed but missing"):
        masked_images("cocostuff27", None, str(tmp_path), 32, 100)
    with pytest.raises(DataError, match="cifar10 has no label maps, so segmentation cannot be scored on it"):
        masked_images("cifar10", DataConfig(name="cifar10"), None, 32, 100)


def test_digits_ink_is_the_object_its_class_plus_one_the_label():
    """The demos' data: the label map is class + 1 where the ink's grey level is >= 0.5, 0 elsewhere, computed
    here from scikit-learn's own 0..16 images."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    m = masked_images("digits", DataConfig(), None, 8, 1000)
    d = load_digits()
    _, test = train_test_split(np.arange(len(d.images)), test_size=0.2, random_state=0, stratify=d.target)
    test = np.sort(test)
    assert m.images.shape == (len(test), 1, 8, 8) and m.labels.shape == (len(test), 8, 8) and m.classes == 11
    ink = np.round(d.images[test] * (255.0 / 16.0)) / 255.0 >= 0.5
    expected = np.where(ink, d.target[test][:, None, None] + 1, 0)
    assert np.array_equal(m.labels.numpy(), expected)
    assert 0.2 < (m.labels > 0).float().mean() < 0.6 and m.card["data"] == "digits"


def test_fashion_mnist_ink_masks_and_another_data_set_named_by_seg_data(fake_fmnist):
    cfg = DataConfig(name="fashion-mnist", path=str(fake_fmnist))
    m = masked_images("fashion-mnist", cfg, None, 28, 20)
    assert m.images.shape == (20, 1, 28, 28) and m.classes == 11
    for label in m.labels:
        garment = label[label > 0]
        assert garment.numel() == 0 or len(garment.unique()) == 1  # one class per image, as the ink's
    grey = m.images * torch.tensor(m.std).view(1, -1, 1, 1) + torch.tensor(m.mean).view(1, -1, 1, 1)
    assert torch.equal(m.labels > 0, grey[:, 0] >= 0.5)
    digits = masked_images("digits", cfg, None, 8, 30)  # --seg-data digits beside a fashion-mnist checkpoint
    assert digits.images.shape == (30, 1, 8, 8) and digits.card["data"] == "digits"


def test_eval_segments_a_cocostuff27_folder_and_refuses_data_without_masks(tmp_path, fake_cifar10, capsys,
                                                                           tiny_fmnistm_checkpoint):
    import json

    from resdecay.cli import main

    ckpt = str(tiny_fmnistm_checkpoint)
    _write_cocostuff(tmp_path / "coco")
    rc = main(["eval", ckpt, "--evals", "segmentation", "--seg-data", "cocostuff27", "--seg-path", str(tmp_path / "coco"),
               "--seg-solver", "kmeans", "--seg-k", "30", "--no-baselines", "--no-progress", "--out", str(tmp_path / "e")])
    assert rc in (0, None)
    row = json.loads(next((tmp_path / "e").rglob("eval.json")).read_text())["results"][0]
    assert row["protocol"]["test"]["data"] == "cocostuff27" and row["protocol"]["k"] == 30
    assert row["protocol"]["test"]["resize"].startswith("short side to 32")
    capsys.readouterr()
    rc = main(["eval", ckpt, "--evals", "segmentation", "--data", "cifar10", "--data-path", str(fake_cifar10),
               "--no-progress", "--out", str(tmp_path / "e2")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "cifar10 has no label maps" in err[0]


# ----------------------------------------------------------------------------- your own folder (--seg-data folder:DIR)
def test_folder_layout_reads_png_and_jpeg_with_the_classes_of_classes_txt(tmp_path):
    """Issue 38 item 10: a user's images (PNG or JPEG) and label maps, 3 classes named by classes.txt, 255 ignored."""
    maps = write_seg_folder(tmp_path / "my")
    m = masked_images(f"folder:{tmp_path / 'my'}", None, None, 32, 100)
    assert m.classes == 3 and m.names == ("ground", "square", "disc") and m.card["classes_from"] == "classes.txt"
    assert m.images.shape == (12, 3, 32, 32) and m.card["chosen"] == "every label map" and m.card["ignore_index"] == 255
    assert m.card["files"] == sorted(maps) and m.card["label_folder"] == "labels"
    for i, name in enumerate(m.card["files"]):
        assert torch.equal(m.labels[i], torch.from_numpy(maps[name].astype(np.int64)))  # same size: no resampling
    # a JPEG image is decoded as PIL decodes it (then normalised): img01 is a .jpg
    jpeg = np.asarray(Image.open(tmp_path / "my" / "images" / "img01.jpg").convert("RGB"), dtype=np.float32) / 255
    pixels = m.images[1] * torch.tensor(m.std).view(3, 1, 1) + torch.tensor(m.mean).view(3, 1, 1)
    assert torch.allclose(pixels.permute(1, 2, 0), torch.from_numpy(jpeg), atol=1e-5)
    same = masked_images("folder", None, str(tmp_path / "my"), 32, 100)  # --seg-data folder --seg-path DIR
    assert torch.equal(same.labels, m.labels)


def test_folder_classes_from_the_maps_and_an_ignore_index_inside_them(tmp_path):
    """Without classes.txt the classes are every value up to the largest; an ignore_index of 0 is not a class and
    the labels above it move down, so the mean runs over the user's 2 classes, not 3."""
    write_seg_folder(tmp_path / "a", names=None)
    m = masked_images(f"folder:{tmp_path / 'a'}", None, None, 32, 100)
    assert m.classes == 3 and m.names == ("0", "1", "2") and m.card["classes_from"].startswith("the label maps")
    write_seg_folder(tmp_path / "b", names=None, ignore=0)  # 0 marks the unlabelled row, and the ground too
    m = masked_images(f"folder:{tmp_path / 'b'}", None, None, 32, 100, ignore_index=0)
    assert m.classes == 2 and m.names == ("1", "2") and set(m.labels.unique().tolist()) == {0, 1, IGNORE}
    assert (m.labels[:, 0] == IGNORE).all() and m.card["ignore_index"] == 0


def test_folder_problems_are_one_line(tmp_path):
    write_seg_folder(tmp_path / "a")
    (tmp_path / "a" / "labels" / "extra.png").write_bytes((tmp_path / "a" / "labels" / "img00.png").read_bytes())
    with pytest.raises(DataError, match=r"extra.jpg\|.jpeg\|.png is missing: .*extra.png has no image"):
        masked_images(f"folder:{tmp_path / 'a'}", None, None, 32, 100)
    write_seg_folder(tmp_path / "b", names=("ground", "square"))  # class 2 is not named
    with pytest.raises(DataError, match="holds label 2 but folder has 2 classes"):
        masked_images(f"folder:{tmp_path / 'b'}", None, None, 32, 100)
    write_seg_folder(tmp_path / "c")
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(tmp_path / "c" / "labels" / "img03.png")  # a colour PNG
    with pytest.raises(DataError, match="img03.png is a 32x32x3 uint8 image, not a label map"):
        masked_images(f"folder:{tmp_path / 'c'}", None, None, 32, 100)
    (tmp_path / "d").mkdir()
    with pytest.raises(DataError, match="is not a segmentation folder: expected images/<name>.png"):
        masked_images(f"folder:{tmp_path / 'd'}", None, None, 32, 100)
    with pytest.raises(DataError, match="name two folders"):
        masked_images(f"folder:{tmp_path / 'a'}", None, str(tmp_path / "b"), 32, 100)
    with pytest.raises(DataError, match="--seg-ignore-index 0 applies to label maps you supply"):
        masked_images("digits", DataConfig(), None, 8, 10, ignore_index=0)


def _labels_all(root, value):
    for f in (root / "labels").iterdir():
        Image.fromarray(np.full((32, 32), value, np.uint8)).save(f)


BAD_FOLDERS = {  # what a user's folder gets wrong -> the one line that names it
    "no labels/ folder": (lambda r: shutil.rmtree(r / "labels"), "is not a segmentation folder: expected images/<name>"),
    "no images/ folder": (lambda r: shutil.rmtree(r / "images"), "is not a segmentation folder: expected images/<name>"),
    "no label maps": (lambda r: [f.unlink() for f in (r / "labels").iterdir()], "labels holds no .png label maps"),
    "label map of another size": (lambda r: Image.fromarray(np.zeros((20, 32), np.uint8)).save(r / "labels" / "img04.png"),
                                  "img04.png is 20x32 but its image img04.png is 32x32"),
    "corrupt image": (lambda r: (r / "images" / "img02.png").write_bytes(b"not a png"),
                      "cannot read {root}/images/img02.png (UnidentifiedImageError"),
    "truncated label map": (lambda r: (r / "labels" / "img02.png").write_bytes((r / "labels" / "img02.png").read_bytes()[:60]),
                            "cannot read {root}/labels/img02.png"),
    "classes.txt not text": (lambda r: (r / "classes.txt").write_bytes(b"ground\n\xf0\x28\x8c\n"),
                             "cannot read {root}/classes.txt (UnicodeDecodeError"),
    "one class name": (lambda r: (r / "classes.txt").write_text("ground\n"), "holds label 1 but folder has 1 classes"),
    "every pixel ignored": (lambda r: ((r / "classes.txt").unlink(), _labels_all(r, IGNORE)),
                            "every pixel of every label map is 255 (--seg-ignore-index), so there is nothing to score"),
}


@pytest.mark.parametrize("problem", list(BAD_FOLDERS))
def test_bad_folders_are_one_line_naming_the_file(tmp_path, problem):
    """Issue 38.10's folder layout, each thing a user's folder can get wrong: one DataError line naming the file
    (a non-UTF-8 classes.txt was a UnicodeDecodeError traceback; an all-ignored folder "the largest, -1")."""
    root = tmp_path / "my"
    write_seg_folder(root, jpeg_every=0)
    make, words = BAD_FOLDERS[problem]
    make(root)
    with pytest.raises(DataError) as e:
        masked_images(f"folder:{root}", None, None, 32, 100)
    assert words.format(root=root) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("problem", ["missing folder", "truncated label map", "classes.txt not text"])
def test_bad_folders_stop_eval_in_one_line_and_leave_no_report_folder(tmp_path, capsys, tiny_fmnistm_checkpoint,
                                                                       problem):
    from resdecay.cli import main

    root = tmp_path / "my"
    if problem == "missing folder":
        words = f"--seg-data folder:{root} is not a folder (missing); pass the folder holding your images/ and labels/"
    else:
        write_seg_folder(root)
        make, words = BAD_FOLDERS[problem]
        make(root)
    rc = main(["eval", str(tiny_fmnistm_checkpoint), "--evals", "segmentation", "--seg-data", f"folder:{root}",
               "--seg-solver", "kmeans", "--no-baselines", "--no-progress", "--out", str(tmp_path / "e")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and words.format(root=root) in err[0], err
    assert not (tmp_path / "e").exists()


def test_label_map_draw_is_class_balanced_seeded_and_nested():
    """Item 10: N label maps are a seeded class-balanced draw, not the first N of a listing (there, 9 of the
    first 9 showed one class)."""
    present = [np.array([0, 1])] * 9 + [np.array([0, 2])] * 3 + [np.array([], dtype=np.int64)]
    for seed in range(5):
        order = label_map_order(present, seed)
        assert sorted(order.tolist()) == list(range(13)) and order[-1] == 12  # every map once, all-ignored last
        first4 = order[:4]
        assert (first4 >= 9).sum() >= 2 and (first4 < 9).sum() >= 1  # the rare class has its turns from the first
        assert np.array_equal(label_map_order(present, seed), order)  # seeded
    assert len({tuple(np.sort(label_map_order(present, s)[:4])) for s in range(5)}) > 1  # and seed-dependent


def test_folder_draw_takes_the_rare_class_and_depends_on_seg_seed(tmp_path):
    write_seg_folder(tmp_path / "my")  # sorted by name, the first 9 maps show class 1, the last 3 class 2
    draws = {s: masked_images(f"folder:{tmp_path / 'my'}", None, None, 32, 4, seed=s) for s in range(4)}
    for seed, m in draws.items():
        assert len(m.images) == 4 and m.card["chosen"] == f"class-balanced draw of 4 of 12 (every label map), seed {seed}"
        assert sum(int((lab == 2).any()) for lab in m.labels) >= 2  # the first 4 by name would hold none
        assert m.card["files"] == sorted(m.card["files"])  # read in file order
    assert len({tuple(m.card["files"]) for m in draws.values()}) > 1


def test_voc_classes_from_its_maps_png_images_and_no_val_txt(tmp_path):
    """VOC's class count is not fixed at 21: labels 0..10 of a VOC-layout folder are 11 classes, of which the 3 its
    maps show are scored and the 8 others named (issue 49.3: not 8 IoUs of 0 in the mean); its images may be PNG;
    without val.txt the N maps are drawn, not the first N."""
    write_seg_folder(tmp_path / "src", n=6, rare=2, names=None)
    for d in ("JPEGImages", "SegmentationClass"):
        (tmp_path / "voc" / d).mkdir(parents=True)
    for i, f in enumerate(sorted((tmp_path / "src" / "images").iterdir())):
        lab = np.asarray(Image.open(tmp_path / "src" / "labels" / f"{f.stem}.png")).copy()
        lab[lab == 2] = 10  # 11 classes, 0..10, of which 3 used
        Image.fromarray(lab).save(tmp_path / "voc" / "SegmentationClass" / f"{f.stem}.png")
        f.rename(tmp_path / "voc" / "JPEGImages" / f.name)  # .png and .jpg
        assert i < 6
    m = masked_images("voc", None, str(tmp_path / "voc"), 32, 100)
    assert m.classes == 3 and m.names == ("0", "1", "10") and len(m.images) == 6
    assert m.card["absent_classes"] == [str(c) for c in range(2, 10)]
    drawn = masked_images(f"voc:{tmp_path / 'voc'}", None, None, 32, 3, seed=0)
    assert drawn.card["chosen"].startswith("class-balanced draw of 3 of 6 (every label map (no id list found))")
    assert drawn.names == ("0", "1", "10")
    assert sum(int((lab == 2).any()) for lab in drawn.labels) >= 1  # maps showing label 10 are the last by name
    _write_voc(tmp_path / "full", label=np.arange(21, dtype=np.uint8).repeat(58)[:1200].reshape(30, 40))
    assert masked_images("voc", None, str(tmp_path / "full"), 32, 100).names == VOC_NAMES
