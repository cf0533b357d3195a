"""Checks the evaluation commands run on their inputs before any expensive work, and
the one-line wording of output failures (an unwritable folder, a full disk).

A model trained for minutes, a proxy network trained for FID or features extracted from a whole
data set are wasted when a bad path, a checkpoint of the wrong kind or an unwritable output folder
is only noticed afterwards; so every command first asks these cheap questions.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from ..data import DataConfig, build_dataset
from ..data.badfiles import SkipBadFiles, count_bad_files, record_bad_file
from ..data.datasets import DataInfo, folder_stats, normalization_card
from ..data.subsets import balanced_subset, describe_subset
from ..errors import UserError, one_line
from ..io import is_disk_full, no_space_message
from ..models import is_diffusion

# data sets that read no folder (scikit-learn's digits, the benchmarks' random images): a --data-path
# beside them would be silently ignored, and the numbers would be of another data set than the user meant
PATHLESS_DATA = ("digits", "synthetic")


def check_data_path(name: str, path: str | None, flag: str = "--data-path") -> None:
    """Refuse a data folder given to a data set that reads none.

    Args:
        name: the data set's name (``data.name``).
        path: the folder the user gave, or None.
        flag: how the user spelled the option, for the message.
    """
    if path and name in PATHLESS_DATA:
        raise UserError(f"{name} is built in and reads no folder, so {flag} {path} would be ignored: drop {flag}, "
                        f"or evaluate the images there with --data imagefolder {flag} {path}")


def unwritable_reason(folder: Path) -> str | None:
    """Why files cannot be written in ``folder`` (created if missing), or None when they can.

    A probe file is written and removed: permission bits alone do not tell (root, read-only mounts, ACLs).

    Args:
        folder: the folder to check.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


def check_writable(folder: Path, fix: str) -> Path:
    """``folder``, created; or a one-line UserError naming it and ``fix``.

    Args:
        folder: the output folder a command will write into.
        fix: the option that chooses another folder, e.g. ``"pass --out DIR"``.
    """
    reason = unwritable_reason(Path(folder))
    if reason is not None:
        raise UserError(f"output folder {folder} is not writable ({reason}): {fix}")
    return Path(folder)


@contextlib.contextmanager
def removed_if_refused(folders: Iterable[Path]):
    """The block may create ``folders`` (and their missing parents); if it fails, those it created and left
    empty are removed again: a refused command leaves no empty ``<out>/<run>/`` behind.

    Args:
        folders: the output folders the block writes into (missing ones are noted before it runs).
    """
    made = []
    for folder in dict.fromkeys(Path(f).absolute() for f in folders):
        top = folder
        while not top.exists() and not top.parent.exists():
            top = top.parent
        if not folder.exists():
            made.append((folder, top))
    try:
        yield
    except BaseException:
        for folder, top in made:
            remove_empty_chain(folder, top)
        raise


def remove_empty_chain(folder: Path, top: Path) -> None:
    """Remove ``folder`` and its parents up to ``top`` while each is an empty folder."""
    while True:
        try:
            folder.rmdir()  # only an empty folder
        except FileNotFoundError:  # never made: its parent may have been
            pass
        except OSError:
            return
        if folder == top:
            return
        folder = folder.parent


def write_failure(path: Path, exc: BaseException, fix: str, nbytes: int = 0) -> str:
    """A failed write in one line: the file, why, and ``fix``; for a full disk, the space needed and free.

    Args:
        path: the file being written.
        exc: what the writer raised (an ``OSError``; ``io.NoSpaceLeft`` from ``atomic_save`` says it all).
        fix: what to do about it.
        nbytes: about how many bytes the file needs.
    """
    if isinstance(exc, UserError):
        return one_line(exc)
    if is_disk_full(exc):
        return no_space_message(path, nbytes, fix)
    reason = exc.strerror if isinstance(exc, OSError) else None  # "Permission denied", without the errno noise
    return f"cannot write {path} ({reason or one_line(exc)}): {fix}"


def warn(message: str) -> None:
    """One warning line on stderr, in the CLI's style.

    Args:
        message: the warning, one line.
    """
    print(f"resdecay: warning: {message}", file=sys.stderr)


def check_encoder_family(checkpoint, family: str, noise_level: float | None = None) -> None:
    """``resdecay eval`` measures encoders, and a diffusion checkpoint's blocks at one noise level
    (``--noise-level``, a fraction of the diffusion time: diffusion checkpoints only).

    Args:
        checkpoint: the checkpoint's path, for the message.
        family: its ``model.family``; noise_level: ``--noise-level`` or None.
    """
    if is_diffusion(family) and noise_level is None:
        raise UserError(f"{checkpoint} is a {family} diffusion model, whose features depend on the noise level: pass "
                        "--noise-level L (0 clean .. 1 pure noise, e.g. 0.1) to measure its blocks at one level, or "
                        f"probe the grid of blocks x levels with `resdecay eval-diffusion {checkpoint}`")
    if noise_level is not None and not is_diffusion(family):
        raise UserError(f"--noise-level applies to diffusion checkpoints (uvit, sit); {checkpoint} is a {family} "
                        "model: drop --noise-level")
    if noise_level is not None and not 0.0 <= noise_level <= 1.0:
        raise UserError(f"--noise-level must lie in [0, 1] (0 = clean, 1 = pure noise), got {noise_level:g}")


def eval_split(data: DataConfig, split: str, img_size: int, bad_files: Path | None = None):
    """One split of a data set for evaluation (no augmentation), under the run's ``data.on_bad_file``.

    With ``skip`` an unreadable image is replaced by the next readable one, exactly as in training,
    and listed in ``<bad_files>/bad_files_<split>.txt``; with ``stop`` (or no folder for the list) the
    first unreadable image stops the evaluation in one line.

    Args:
        data: the data config (the run's, or the one the user passed).
        split: "train" or "test".
        img_size: the model's input side.
        bad_files: the folder for the lists of replaced files (the report folder), or None.
    """
    dataset, _ = build_dataset(data, split, img_size, augment=False)
    if data.on_bad_file == "skip" and bad_files is not None:
        dataset = SkipBadFiles(dataset, bad_files_list(bad_files, split))
    return dataset


def split_card(data: DataConfig, split: str, n: int, total: int, img_size: int) -> dict:
    """The protocol card of the images of one split an evaluation read (part of feature- and
    baseline-cache keys): the data set, its folder, how many images and, for a subset, how drawn.

    Args:
        data: the data config; split: "train" or "test"; n: the images used; total: the split's
        images; img_size: the side they were read at.
    """
    path = str(Path(data.path).resolve()) if data.path else None
    card = {"data": data.name, "data_path": path, "split": split, "images": n, "img_size": img_size,
            "augmentation": "none", "resize": data.resize}
    if n < total:  # only then: keys of whole-split features written before subsets were recorded stay valid
        card["subset"] = describe_subset(n, total, split, data.subset_seed)
    if data.name == "fashion-mnist-m":  # its knobs make other images of the same name: in the card and cache keys
        card["generator"] = {"canvas": data.canvas, "nuisances": list(data.nuisances), "dataset_seed": data.dataset_seed,
                             "composition": data.composition}
    if data.name == "imagefolder":  # "dataset" reads as the folder's statistics, but they are ImageNet's: say which
        card["normalize"] = normalization_card(data, DataInfo("imagefolder", 0, 3, None, *folder_stats(data)))
    return card


def bad_files_list(folder: Path, split: str) -> Path:
    """Where ``eval_split`` lists the unreadable files of ``split`` it replaced.

    Args:
        folder: the report folder; split: "train" or "test".
    """
    return Path(folder) / f"bad_files_{split}.txt"


def replaced_count(folder: Path | None, split: str) -> int:
    """How many unreadable files of ``split`` were replaced (0 without a list).

    Args:
        folder: the report folder, or None; split: "train" or "test".
    """
    return count_bad_files(bad_files_list(folder, split)) if folder is not None else 0


def replaced_list(folder: Path, split: str) -> str:
    """The list of replaced files of ``split`` as text ("" when none), to keep with cached features.

    Args:
        folder: the report folder; split: "train" or "test".
    """
    path = bad_files_list(folder, split)
    return path.read_text() if path.is_file() else ""


def restore_replaced(folder: Path, split: str, text: str) -> int:
    """Write back the list kept with cached features (when nothing was read again, nothing was
    listed); returns how many files it names.

    Args:
        folder: the report folder.
        split: "train" or "test".
        text: ``replaced_list``'s text, from the cache.
    """
    for line in text.splitlines():
        path, _, reason = line.partition("\t")
        if path:
            record_bad_file(bad_files_list(folder, split), path, reason)
    return replaced_count(folder, split)


def fixed_subsets(data, img_size: int, size: int):
    """(bank, queries, card): ``size`` train and ``size`` test images, class-balanced and seeded,
    the same at every evaluation of the run, and the card saying how they were drawn."""
    bank, info = build_dataset(data, "train", img_size, augment=False)
    queries, _ = build_dataset(data, "test", img_size, augment=False)
    chosen = [balanced_subset(ds, size, data.subset_seed) for ds in (bank, queries)]
    card = {"bank": describe_subset(len(chosen[0]), len(bank), "train", data.subset_seed),
            "queries": describe_subset(len(chosen[1]), len(queries), "test", data.subset_seed),
            "subset": f"each class's images shuffled with data.subset_seed={data.subset_seed}, classes dealt in turn "
                      "(an even share per class), the same images at every evaluation",
            "normalize": normalization_card(data, info)}
    return chosen[0], chosen[1], card
