"""The optional DALI decode path (data.decoder=dali, data/dali_images.py, issue 14): crops drawn on
the host from the run's seeded generator, equal to the uint8 path's; refused in one line when DALI is
missing. The pipeline tests run DALI's CPU decoder (device_id=None) where the package is installed."""

import sys

import pytest
import torch

from helpers import assert_one_line_error, run
from resdecay.data.dali_images import crop_window, folder_samples
from resdecay.data.datasets import DataConfig, build_dataset
from resdecay.data.fast_images import normalize
from resdecay.data.resumable import ResumableSampler, SeededSamples
from resdecay.data.transforms import create_transform
from resdecay.errors import ConfigError


@pytest.fixture
def photo_folder(tmp_path):
    """JPEGs of real photographs (scikit-learn's), of different sizes, in two classes."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    for i in range(8):
        d = tmp_path / "photos" / "train" / "ab"[i % 2]
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photos[i % 2][i * 9: i * 9 + 300, i * 17: i * 17 + 400 - i * 10]).save(d / f"{i}.jpg", quality=90)
    return tmp_path / "photos"


def test_crop_window_is_the_uint8_paths_crop(photo_folder):
    import torchvision.transforms.v2.functional as F

    ds, _ = build_dataset(DataConfig("imagefolder", path=str(photo_folder), augment="mae"), "train", 32, uint8_out=True)
    samples = SeededSamples(ds, seed=5)
    from resdecay.data.fast_images import decode_uint8
    for key in [(0, 0), (3, 0), (3, 1), (7, 4)]:
        img = decode_uint8(folder_samples(samples)[key[0]][0])
        top, left, h, w, flip = crop_window(key, 5, img.shape[1], img.shape[2], (0.2, 1.0))
        expect = F.resized_crop(img, top, left, h, w, [32, 32], interpolation=F.InterpolationMode.BICUBIC, antialias=True)
        expect = expect.flip(-1) if flip else expect
        assert torch.equal(samples[key][0], expect)


def test_dali_missing_or_misused_is_one_line(capsys, monkeypatch, photo_folder, tmp_path):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # as if the package were not installed
    args = ["pretrain", "--preset", "mae-tiny-digits", "data.name=imagefolder", f"data.path={photo_folder}",
            "data.augment=mae", "model.img_size=32", "model.in_chans=3", "train.batch_size=4", "train.epochs=1",
            f"train.out_dir={tmp_path / 'run'}", "--no-progress"]
    assert_one_line_error(*run(capsys, *args, "data.decoder=dali")[::2], "pip install nvidia-dali-cuda130")
    with pytest.raises(ConfigError, match="data.decoder=dali decodes ImageFolder training crops"):
        DataConfig("digits", decoder="dali").validate()


def _dali_and_reference(photo_folder, start=0):
    pytest.importorskip("nvidia.dali")
    from resdecay.data.dali_images import DaliLoader

    data = DataConfig("imagefolder", path=str(photo_folder), augment="mae", decoder="dali")
    ds, info = build_dataset(data, "train", 48, uint8_out=True)
    samples = SeededSamples(ds, seed=3)
    crops = create_transform(data.augment, 48, "dali", mean=info.mean, std=info.std)
    assert (crops.size, crops.scale, crops.mean, crops.std) == (48, (0.2, 1.0), info.mean, info.std)
    mean, std = crops.mean, crops.std
    sampler = ResumableSampler(len(samples), seed=3)
    sampler.set_epoch(2, start=start)
    ref = torch.stack([samples[k][0] for k in iter(sampler)])
    loader = DaliLoader(folder_samples(ds), sampler, 2, crops.size, crops.scale, 3, mean, std, torch.device("cpu"), threads=1)
    got = torch.cat([x for x, _ in loader])
    return got, normalize(ref, mean, std), torch.tensor(std).view(1, 3, 1, 1) * 255


def test_dali_batches_match_the_uint8_path(photo_folder):
    got, ref, to_levels = _dali_and_reference(photo_folder)
    levels = (got - ref).abs() * to_levels  # in 0-255 grey levels
    assert got.shape == ref.shape == (8, 3, 48, 48)
    assert levels.mean() < 1.0  # same window and flip; only the resampling filter differs
    assert ((got - ref.flip(-1)).abs() * to_levels).mean() > 10  # a wrong flip would be far off


def test_dali_resumes_mid_epoch_with_the_same_crops(photo_folder):
    full, _, _ = _dali_and_reference(photo_folder)
    tail, _, _ = _dali_and_reference(photo_folder, start=4)
    assert torch.equal(tail, full[4:])


def test_dali_names_an_unreadable_file_in_one_line(capsys, photo_folder, tmp_path):
    pytest.importorskip("nvidia.dali")
    (photo_folder / "train" / "b" / "zz.jpg").write_text("not an image")
    code, out, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "data.name=imagefolder", f"data.path={photo_folder}",
                         "data.augment=mae", "data.decoder=dali", "model.img_size=32", "model.in_chans=3",
                         "train.batch_size=9", "train.epochs=1", f"train.out_dir={tmp_path / 'run'}", "--no-progress")
    assert_one_line_error(code, err, "cannot read image", "zz.jpg")
