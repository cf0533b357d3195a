"""The on-disk cache of extracted features (``<run>/eval/cache`` by default).

It is only a cache: a researcher evaluating someone else's read-only run, or a disk that fills up
while a cache file is written, still gets the numbers, with one warning line saying the features
were not kept. Reads work in a read-only folder, so features cached by the run's owner
are still reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import UserError, one_line
from ...io import atomic_save, safe_load, sweep_stale_temps
from ..inputs import unwritable_reason, warn, write_failure


@dataclass
class FeatureCache:
    """A cache folder and whether files can be written there.

    Args:
        dir: the folder holding ``<split>-<digest>.pt`` files.
        writable: False once a write was refused; later writes are skipped without another warning.
    """

    dir: Path
    writable: bool = True

    @classmethod
    def open(cls, folder: Path) -> FeatureCache:
        """The cache at ``folder``, warning once (and caching nothing) when it cannot be written.

        Args:
            folder: the cache folder (created if missing and possible).
        """
        folder = Path(folder)
        reason = unwritable_reason(folder)
        if reason is not None:
            warn(f"feature cache {folder} is not writable ({reason}): evaluating without caching the features; "
                 "pass --cache-dir DIR to keep them")
        else:
            sweep_stale_temps(folder)  # left by an eval killed while writing
        return cls(folder, reason is None)

    def sub(self, name: str) -> FeatureCache:
        """A sub-folder (e.g. the random-init encoder's) with the same write permission.

        Args:
            name: the sub-folder's name.
        """
        return FeatureCache(self.dir / name, self.writable)

    def load(self, file: Path, wanted: list[tuple], n: int) -> tuple | None:
        """(feats, labels, blob) from ``file``, or None (see ``load_cached``; a damaged file is
        deleted only where the cache may be written).

        Args:
            file: the cache file; wanted: the (layer, pooling) keys; n: the number of images.
        """
        return load_cached(file, wanted, n, remove_damaged=self.writable)

    def save(self, blob: dict, file: Path) -> bool:
        """Write ``blob`` to ``file`` atomically; on failure (full disk, read-only) warn and go on.

        Args:
            blob: the cache entry (tensors and strings).
            file: where it goes, inside ``self.dir``.

        Returns:
            Whether the file was written.
        """
        if not self.writable:
            return False
        fix = "the numbers are computed anyway, the features are not cached"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_save(blob, file, fix=fix)  # a full disk: io.NoSpaceLeft (an OSError) naming the file and the space
            return True
        except OSError as e:
            self.writable = False
            warn(write_failure(file, e, fix))
            return False


def load_cached(file: Path, wanted: list[tuple], n: int, remove_damaged: bool = True) -> tuple | None:
    """(feats, labels, blob) from a cache file, or None when there is none. A damaged file
    (truncated, empty, not a cache, wrong shapes) is reported in one line, deleted and recomputed.

    Args:
        file: the cache file.
        wanted: the (layer, pooling) keys it must hold.
        n: the number of images it must hold features of.
        remove_damaged: delete a damaged file (not in a read-only cache).
    """
    if not file.exists():
        return None
    try:
        blob = safe_load(file, UserError, "{reason}")
        feats = {(int(k.split(":")[0]), k.split(":")[1]): v for k, v in blob["feats"].items()}
        labels = blob["labels"]
        if not (isinstance(labels, torch.Tensor) and len(labels) == n
                and all(isinstance(feats.get(k), torch.Tensor) and len(feats[k]) == n for k in wanted)):
            raise ValueError(f"it does not hold features of the {n} images")
    except (UserError, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        warn(f"feature cache {file} is damaged ({one_line(e)}); recomputing it")
        if remove_damaged:
            file.unlink(missing_ok=True)
        return None
    return feats, labels, blob
