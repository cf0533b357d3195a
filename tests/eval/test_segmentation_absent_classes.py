"""Issue 49 item 3: a folder whose label maps are all ignored is refused with or without ``classes.txt`` (with it,
the model and both baselines were written as mIoU 0.0000), and a class that ``classes.txt`` names but no scored
label map shows is named in the report and left out of mIoU, instead of adding an IoU of 0 (and taking one of the
K clusters, which the one-to-one matching then gave to it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from helpers import assert_one_line_error, run
from helpers.seg_folders import IGNORE, write_seg_folder
from resdecay.data.seg_masks import masked_images
from resdecay.errors import DataError

NAMES = ("ground", "sky", "square", "disc")  # "sky" (label 1) is in no label map


def _with_an_absent_class(root):
    """The 3-class folder of ``write_seg_folder`` with its labels 1, 2 moved to 2, 3 and classes.txt naming 4
    classes: label 1 ("sky") is named but never drawn."""
    write_seg_folder(root)
    for f in (root / "labels").iterdir():
        lab = np.asarray(Image.open(f)).copy()
        lab[(lab == 1) | (lab == 2)] += 1
        Image.fromarray(lab).save(f)
    (root / "classes.txt").write_text("\n".join(NAMES) + "\n")


def _eval(capsys, checkpoint, folder, out):
    code, printed, err = run(capsys, "eval", checkpoint, "--evals", "segmentation", "--seg-data", f"folder:{folder}",
                             "--seg-solver", "kmeans", "--no-progress", "--out", out)
    assert code in (0, None), err
    return json.loads(next(out.rglob("eval.json")).read_text()), printed


def test_all_ignored_label_maps_are_refused_with_classes_txt_too(tmp_path, capsys, tiny_fmnistm_checkpoint):
    root = tmp_path / "my"
    write_seg_folder(root)
    assert (root / "classes.txt").is_file()
    for f in (root / "labels").iterdir():
        Image.fromarray(np.full((32, 32), IGNORE, np.uint8)).save(f)
    words = "every pixel of every label map is 255 (--seg-ignore-index), so there is nothing to score"
    with pytest.raises(DataError, match=r"every pixel of every label map is 255") as e:
        masked_images(f"folder:{root}", None, None, 32, 100)
    assert words in str(e.value) and "\n" not in str(e.value)
    code, _, err = run(capsys, "eval", tiny_fmnistm_checkpoint, "--evals", "segmentation", "--seg-data",
                       f"folder:{root}", "--seg-solver", "kmeans", "--no-progress", "--out", tmp_path / "e")
    assert_one_line_error(code, err, words, "--seg-ignore-index to the label of unlabelled pixels")
    assert not (tmp_path / "e").exists()


def test_ignore_index_inside_the_range_with_classes_txt_and_only_that_value_is_refused(tmp_path):
    """The same with --seg-ignore-index 0 (a value inside classes.txt's range) and every pixel 0."""
    root = tmp_path / "my"
    write_seg_folder(root)
    for f in (root / "labels").iterdir():
        Image.fromarray(np.zeros((32, 32), np.uint8)).save(f)
    with pytest.raises(DataError, match="every pixel of every label map is 0 .--seg-ignore-index., so there is "
                                        "nothing to score"):
        masked_images(f"folder:{root}", None, None, 32, 100, ignore_index=0)


def test_a_class_no_label_map_shows_is_taken_out_and_named(tmp_path):
    _with_an_absent_class(tmp_path / "absent")
    write_seg_folder(tmp_path / "plain")
    m = masked_images(f"folder:{tmp_path / 'absent'}", None, None, 32, 100)
    plain = masked_images(f"folder:{tmp_path / 'plain'}", None, None, 32, 100)
    assert m.classes == 3 and m.names == ("ground", "square", "disc") and m.card["absent_classes"] == ["sky"]
    assert m.card["classes"] == 3 and m.card["class_names"] == ["ground", "square", "disc"]
    assert (m.labels == plain.labels).all()  # label 2 -> class 1, label 3 -> class 2, 255 kept
    assert "absent_classes" not in plain.card


def _brute_force_miou(files: dict, labels_dir, clusters, mapping, names) -> tuple[float, dict]:
    """mIoU over the label values the files hold, from the raw PNGs: IoU of each value (predicted value = the class
    name its cluster was matched to, looked up in classes.txt's order), 255 excluded, averaged over the values that
    occur."""
    raw = np.stack([np.asarray(Image.open(labels_dir / f"{f}.png")) for f in files])
    value_of = {n: i for i, n in enumerate(NAMES)}
    pred = np.vectorize(lambda c: value_of[names[c]] if c >= 0 else -1)(mapping[clusters])
    valid = raw != IGNORE
    iou = {}
    for v in sorted(set(np.unique(raw[valid]).tolist())):
        p, y = (pred == v) & valid, (raw == v) & valid
        iou[NAMES[v]] = (p & y).sum() / (p | y).sum()
    return float(np.mean(list(iou.values()))), iou


def test_miou_is_the_mean_over_the_classes_present(tmp_path):
    """mIoU, recomputed from the raw label maps and the matched clusters, over the three classes that occur."""
    from resdecay.eval.segmentation.segment import SegProtocol, segment
    from resdecay.eval.segmentation.source import pixel_patches

    root = tmp_path / "absent"
    _with_an_absent_class(root)
    m = masked_images(f"folder:{root}", None, None, 32, 100)
    out = segment(pixel_patches(m.images, (8, 8)), (8, 8), m.labels, m.classes, SegProtocol(solver="kmeans"),
                  names=m.names)
    assert out["k"] == 3  # K = the classes present
    want, iou = _brute_force_miou(m.card["files"], root / "labels", out["clusters"].numpy(), out["mapping"], m.names)
    assert list(iou) == ["ground", "square", "disc"]
    assert out["values"]["miou"] == pytest.approx(want, abs=1e-12)
    assert out["values"]["iou"] == pytest.approx(iou, abs=1e-12)


def test_eval_names_an_absent_class_once_and_scores_as_without_it(tmp_path, capsys, tiny_fmnistm_checkpoint):
    """Through the command line: the model's and both baselines' numbers are those of the same folder whose
    classes.txt lists only the 3 classes the maps show; eval.json's card and the printed protocol name "sky"."""
    _with_an_absent_class(tmp_path / "absent")
    write_seg_folder(tmp_path / "plain")
    report, printed = _eval(capsys, tiny_fmnistm_checkpoint, tmp_path / "absent", tmp_path / "e1")
    plain, _ = _eval(capsys, tiny_fmnistm_checkpoint, tmp_path / "plain", tmp_path / "e2")
    (row,), (plain_row,) = report["results"], plain["results"]
    assert row["protocol"]["test"]["absent_classes"] == ["sky"] and row["protocol"]["classes"] == 3
    assert row["protocol"]["k"] == 3 and list(row["values"]["iou"]) == ["ground", "square", "disc"]
    assert row["values"] == plain_row["values"]
    assert np.isclose(row["values"]["miou"], np.mean(list(row["values"]["iou"].values())))
    assert [b["values"] for b in report["baselines"]] == [b["values"] for b in plain["baselines"]]
    assert len(report["baselines"]) == 2
    assert printed.count("sky") == 1 and "not in any scored label map (left out of mIoU): sky" in printed


def test_label_maps_showing_one_class_only_are_refused(tmp_path):
    """classes.txt names 3 classes but every scored pixel is "ground": nothing for mIoU to tell apart."""
    root = tmp_path / "my"
    write_seg_folder(root)
    for f in (root / "labels").iterdir():
        lab = np.zeros((32, 32), np.uint8)
        lab[0] = IGNORE
        Image.fromarray(lab).save(f)
    with pytest.raises(DataError, match=r"the 12 scored label maps show one class only \('ground'\), and mIoU needs 2"):
        masked_images(f"folder:{root}", None, None, 32, 100)


def test_a_built_in_data_sets_few_drawn_images_are_scored_over_their_classes(tmp_path, capsys, tiny_fmnistm_checkpoint):
    """Fashion-MNIST-M's 11 classes (background + 10 garments), 4 images drawn: the 6 garments none of them shows
    are named, K and the mean are over the 5 classes present (it was K=11 over 11, six IoUs of 0)."""
    code, printed, err = run(capsys, "eval", tiny_fmnistm_checkpoint, "--evals", "segmentation", "--seg-images", "4",
                             "--seg-solver", "kmeans", "--no-baselines", "--no-progress", "--out", tmp_path / "e")
    assert code in (0, None), err
    (row,) = json.loads(next((tmp_path / "e").rglob("eval.json")).read_text())["results"]
    card = row["protocol"]
    assert card["classes"] == card["k"] == 5 and len(card["test"]["absent_classes"]) == 6
    assert card["test"]["class_names"][0] not in card["test"]["absent_classes"]  # background is in every image
    assert len(set(card["test"]["class_names"]) | set(card["test"]["absent_classes"])) == 11
    assert list(row["values"]["iou"]) == card["test"]["class_names"]
    assert np.isclose(row["values"]["miou"], np.mean(list(row["values"]["iou"].values())))
    assert "K=5 over 5 classes" in printed and "left out of mIoU): " in printed
