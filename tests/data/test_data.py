import pytest
import torch
from torch.utils.data import DataLoader

from resdecay.data import DataConfig, ResumableSampler, SeededSamples, build_dataset, check_first_sample
from resdecay.errors import DataError


def test_digits_split_and_normalisation():
    tr, info = build_dataset(DataConfig("digits"), "train", 8)
    te, _ = build_dataset(DataConfig("digits"), "test", 8)
    assert (len(tr), len(te)) == (1437, 360) and info.num_classes == 10 and info.in_chans == 1
    x, y = tr[0]
    assert x.shape == (1, 8, 8) and 0 <= y < 10
    allx = torch.stack([tr[i][0] for i in range(len(tr))])
    assert abs(allx.mean().item()) < 0.05 and abs(allx.std().item() - 1) < 0.05


def test_fashion_mnist_idx_folder(fake_fmnist):
    tr, info = build_dataset(DataConfig("fashion-mnist", path=str(fake_fmnist)), "train", 28)
    te, _ = build_dataset(DataConfig("fashion-mnist", path=str(fake_fmnist)), "test", 28)
    assert (len(tr), len(te), info.native_size) == (96, 32, 28)
    assert tr[3][1] == 3 and tr[3][0].shape == (1, 28, 28)
    sub, _ = build_dataset(DataConfig("fashion-mnist", path=str(fake_fmnist), train_subset=10), "train", 28)
    assert len(sub) == 10


def test_cifar10_torchvision_format(fake_cifar10):
    tr, info = build_dataset(DataConfig("cifar10", path=str(fake_cifar10)), "train", 32)
    te, _ = build_dataset(DataConfig("cifar10", path=str(fake_cifar10 / "cifar-10-batches-py")), "test", 32)
    assert (len(tr), len(te), info.in_chans) == (40, 8, 3)
    assert tr[0][0].shape == (3, 32, 32)


def test_imagefolder_with_mae_augmentation(fake_imagefolder):
    cfg = DataConfig("imagefolder", path=str(fake_imagefolder), augment="mae")
    tr, info = build_dataset(cfg, "train", 32)
    te, _ = build_dataset(cfg, "test", 32)
    assert (len(tr), len(te), info.num_classes) == (12, 4, 2)
    assert tr[0][0].shape == (3, 32, 32) and te[0][0].shape == (3, 32, 32)


@pytest.mark.parametrize("name", ["fashion-mnist", "cifar10", "imagefolder"])
def test_missing_path_is_one_clear_error(tmp_path, name):
    with pytest.raises(DataError, match="does not exist"):
        build_dataset(DataConfig(name, path=str(tmp_path / "nope")), "train", 32)


def test_empty_folders(tmp_path):
    (tmp_path / "empty" / "train" / "cls").mkdir(parents=True)
    with pytest.raises(DataError, match="holds no images"):
        build_dataset(DataConfig("imagefolder", path=str(tmp_path / "empty")), "train", 32)
    (tmp_path / "fm").mkdir()
    with pytest.raises(DataError, match="holds no Fashion-MNIST file train-images-idx3-ubyte"):
        build_dataset(DataConfig("fashion-mnist", path=str(tmp_path / "fm")), "train", 28)
    with pytest.raises(DataError, match="cifar-10-batches-py"):
        build_dataset(DataConfig("cifar10", path=str(tmp_path / "fm")), "train", 32)


def test_unreadable_image_is_named(fake_imagefolder):
    bad = fake_imagefolder / "train" / "cat" / "0.png"
    bad.write_bytes(b"this is not a png")
    ds, _ = build_dataset(DataConfig("imagefolder", path=str(fake_imagefolder)), "train", 32)
    with pytest.raises(DataError, match=r"cannot read image .*cat/0\.png"):
        ds[0]


def test_size_mismatch_and_resize(fake_fmnist):
    with pytest.raises(DataError, match="images are 28x28 but model.img_size is 32; set model.img_size=28"):
        build_dataset(DataConfig("fashion-mnist", path=str(fake_fmnist)), "train", 32)
    ds, _ = build_dataset(DataConfig("fashion-mnist", path=str(fake_fmnist), resize=True), "train", 32)
    assert ds[0][0].shape == (1, 32, 32)


def test_channel_mismatch_is_caught_up_front():
    ds, _ = build_dataset(DataConfig("digits"), "train", 8)
    with pytest.raises(DataError, match="1 channels but model.in_chans is 3"):
        check_first_sample(ds, 3, 8, "digits")


def test_sampler_resumes_mid_epoch_and_splits_ranks():
    s = ResumableSampler(10, seed=1)
    s.set_epoch(2)
    full = list(s)
    s.set_epoch(2, start=4)
    assert list(s) == full[4:]
    s.set_epoch(3)
    assert [i for i, _ in list(s)] != [i for i, _ in full]  # new order each epoch
    ranks = [ResumableSampler(10, rank=r, world_size=3, seed=1) for r in range(3)]
    seen = [i for r in ranks for i, _ in r]
    assert len(seen) == 12 and set(seen) == set(range(10))  # padded to 4 per rank, nothing dropped


def test_augmentation_is_a_function_of_seed_epoch_index_only():
    ds, _ = build_dataset(DataConfig("digits", augment="mae"), "train", 8)
    samples = SeededSamples(ds, seed=0)
    a = samples[(5, 1)][0]
    torch.manual_seed(123)  # global RNG state must not matter ...
    state = torch.get_rng_state()
    b = samples[(5, 1)][0]
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), state)  # ... and must not be touched
    assert not torch.equal(samples[(5, 2)][0], a)  # a new epoch gives a new crop


def test_loader_with_workers_gives_same_batches_as_without():
    ds, _ = build_dataset(DataConfig("digits", augment="flip"), "train", 8)
    samples = SeededSamples(ds, seed=0)
    out = []
    for workers in (0, 2):
        sampler = ResumableSampler(len(samples), seed=0)
        sampler.set_epoch(1, start=64)
        dl = DataLoader(samples, batch_size=32, sampler=sampler, num_workers=workers, generator=torch.Generator())
        out.append(torch.cat([x for x, _ in list(dl)[:3]]))
    assert torch.equal(out[0], out[1])
