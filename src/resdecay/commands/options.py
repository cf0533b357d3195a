"""Option values several commands read the same way, turned into what the library takes, each
refused in one line that names the flag: a block index, the metrics' own flags and the segmentation protocol, a data set
named on the command line, a list of noise levels."""

from __future__ import annotations

from ..data import DataConfig
from ..errors import UserError
from ..eval.inputs import check_data_path
from ..eval.metrics import flag_options
from ..eval.options import resolve
from ..eval.segmentation.segment import SegProtocol


def block_index(value: str, flag: str) -> int:
    """``--layer``'s block index (``-1`` for the last)."""
    try:
        return int(value)
    except ValueError:
        raise UserError(f"{flag} must be a block index (e.g. -1 for the last) or 'all', got {value!r}") from None


def seg_protocol(args) -> SegProtocol:
    """The segmentation protocol of the ``--seg-*`` flags (``figures --segmentation``)."""
    return resolve("segmentation", flag_options(getattr(args, "metric_flags", None)).get("segmentation", {}))


def data_config(name: str | None, path: str | None, normalize: str = "dataset") -> DataConfig | None:
    """``--data NAME --data-path DIR`` as a checked data config; None when no data set is named."""
    if name is None:
        if path:
            raise UserError("--data-path needs --data (digits, fashion-mnist, cifar10, cifar100, imagefolder, latents)")
        return None
    check_data_path(name, path)  # digits reads no folder: a path beside it would be silently ignored
    cfg = DataConfig(name=name, path=path, normalize=normalize)
    cfg.validate()
    return cfg


def noise_levels(text: str) -> tuple[float, ...]:
    """``--noise-levels 0,0.1,0.25``: fractions of the diffusion time."""
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--noise-levels takes comma-separated numbers in [0, 1], e.g. 0,0.1,0.25; got {text!r}") from None
