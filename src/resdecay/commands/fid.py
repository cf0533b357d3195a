"""``resdecay fid SAMPLES --ref STATS|DATA``: the command around ``eval.fid``.

``--ref`` is either a statistics file (built earlier, reused as is) or a dataset name: then the
reference statistics of its *training* split are built once with the chosen extractor, saved
(``--ref-out``, default ``runs/fid_refs/<data>-train-<extractor>.pt``) and reused on the next call
when the extractor is the same. The extractor is Inception-v3 from ``--inception-weights`` (real
FID) or, with ``--proxy``, a small CNN resdecay trains once on the dataset ("proxy FID").
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..eval.fid import PROXY_DATASETS, compute_fid, dataset_reference, inception_extractor, load_stats, proxy_extractor
from ..train.distributed import resolve_device


def _extractor(proxy: bool, inception_weights: str | None, dataset: str | None, data_path, device):
    if inception_weights and proxy:
        raise UserError("pass either --inception-weights PATH (FID) or --proxy (proxy FID), not both")
    if inception_weights:
        return inception_extractor(inception_weights)
    if not proxy:
        raise UserError("FID needs Inception weights: pass --inception-weights PATH (pt_inception-2015-12-05-*.pth), "
                        "or --proxy for a proxy FID on digits / fashion-mnist / cifar")
    if dataset is None:
        raise UserError("this reference stats file does not name its dataset, so the proxy extractor cannot be rebuilt; "
                        "pass --ref DATASET to build the reference again")
    return proxy_extractor(dataset, data_path=data_path, device=device)


def run_fid(samples: str, ref: str, data_path: str | None = None, inception_weights: str | None = None,
            proxy: bool = False, batch_size: int = 200, device: str = "auto", ref_out: str | None = None,
            allow_few: bool = False, progress: bool = True, img_size: int = 256) -> dict:
    if batch_size < 1:
        raise UserError(f"--batch-size must be a positive integer, got {batch_size}")
    dev = resolve_device(device, "--device")
    if not Path(samples).is_file():
        raise UserError(f"no samples file at {samples}: pass an ADM-format .npz (arr_0: uint8 NHWC), e.g. from `resdecay sample`")
    if Path(ref).is_file():
        stats = load_stats(ref)
        extractor = _extractor(proxy, inception_weights, stats.get("dataset"), data_path, dev)
        ref_path, built = Path(ref), False
    elif ref in PROXY_DATASETS or ref == "imagefolder":
        extractor = _extractor(proxy, inception_weights, ref, data_path, dev)
        stats, ref_path, built = dataset_reference(ref, extractor, data_path, batch_size, dev, ref_out, img_size, progress)
    else:
        raise UserError(f"--ref {ref!r} is neither a statistics file nor a dataset; pass a .pt file from an earlier run "
                        f"or one of {', '.join(PROXY_DATASETS)}")
    result = compute_fid(samples, stats, extractor, batch_size, dev, allow_few=allow_few, progress=progress)
    result["protocol"].update({"samples": str(samples), "reference": str(ref_path),
                               "reference_split": "train" if stats.get("dataset") else "as built", "reference_built_now": built})
    return result
