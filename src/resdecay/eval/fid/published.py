"""What makes a Fréchet distance "FID": the published Inception weights, recognised by their digest, and
the statistics files other tools publish with them (pytorch-fid's ``.npz`` with ``mu`` and ``sigma``,
ADM's reference batches), read as reference statistics, so a score compares with theirs. ``stats.py`` uses both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...errors import UserError

STATS_FORMAT = "resdecay-fid-stats-v1"
INCEPTION_LABEL = "FID (Inception-v3, torchmetrics)"
# The published FID Inception weights (pytorch-fid's pt_inception-2015-12-05-6726825d.pth, torch-fidelity's
# weights-inception-2015-12-05-6726825d.pth): as torch.hub names files, the suffix is the start of the file's
# sha256, the check torch.hub's check_hash makes. Only features of this file give a number called "FID".
PUBLISHED_INCEPTION = "6726825d"
EXTERNAL_STATS = "pytorch-fid / ADM statistics (mu, sigma)"
INCEPTION_RESIZE = "bilinear (torch-fidelity, 299x299)"


def is_published(fingerprint: str | None) -> bool:
    """Whether an Inception weights file (by its sha256 prefix) is the published FID file."""
    return bool(fingerprint) and fingerprint.startswith(PUBLISHED_INCEPTION)


def inception_label(fingerprint: str | None) -> str:
    """"FID" for the published weights only; any other file's number is said plainly not to be FID."""
    if is_published(fingerprint):
        return INCEPTION_LABEL
    return (f"Inception-v3 Frechet distance, NOT FID (weights sha256 {fingerprint}..., not the published FID file "
            f"*-{PUBLISHED_INCEPTION}.pth)")


def npz_has_stats(path) -> bool:
    """Whether ``path`` is an ``.npz`` holding ``mu`` and ``sigma``: pytorch-fid's statistics files
    (``--save-stats``) and ADM's reference batches (which hold images under ``arr_0`` too)."""
    path = Path(path).expanduser()
    if path.suffix.lower() != ".npz" or not path.is_file():
        return False
    try:
        with np.load(path) as z:
            return {"mu", "sigma"} <= set(z.files)
    except Exception:  # not a readable .npz: the image-set reader says why
        return False


def load_npz_stats(path: Path) -> dict:
    """pytorch-fid's / ADM's ``mu``, ``sigma`` as stats: Inception pool features of the published weights,
    whose image count, size and batch size the file does not say (None)."""
    with np.load(path) as z:
        mu, sigma = (torch.from_numpy(np.asarray(z[k], dtype=np.float64)) for k in ("mu", "sigma"))
    if mu.ndim != 1 or tuple(sigma.shape) != (len(mu),) * 2:
        raise UserError(f"{path}: mu {tuple(mu.shape)} and sigma {tuple(sigma.shape)} are not a mean vector and its "
                        "covariance matrix; pass pytorch-fid's statistics (mu (2048,), sigma (2048, 2048))")
    return {"format": STATS_FORMAT, "mu": mu, "sigma": sigma, "n": None, "source": EXTERNAL_STATS,
            "extractor": "inception-v3-compat", "extractor_id": f"inception-v3-compat@{PUBLISHED_INCEPTION}",
            "label": INCEPTION_LABEL, "resolution": None, "resize_filter": "as made by the file's tool",
            "grayscale_to_rgb": None, "batch_size": None, "dtype": "float64"}
