"""Images with label maps for the segmentation metric: Fashion-MNIST-M's compositor masks, and the
COCO-Stuff-27 (STEGO / PiCIE curated) and Pascal VOC folder layouts, each written at test time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from resdecay.data import DataConfig
from resdecay.data.fashion_mnist_m import NUISANCES, composite
from resdecay.data.seg_masks import COCO_CURATED, COCO_FINE_TO_27, IGNORE, coco_to_27, masked_images
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
    assert masked_images("cocostuff27", None, str(tmp_path), 32, 2).images.shape[0] == 2  # the first N


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
    (lambda r: _write_voc(r, label=np.full((30, 40), 30, dtype=np.uint8)), "holds label 30 but voc has 21 classes"),
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
