"""The FID metric (``samples``): a proxy or Inception FID of generated images against reference
statistics; the diffusion families' online tracking reports it."""

from __future__ import annotations

from ..display import Column, Display
from ..metrics import SAMPLES, Metric, Result
from ..protocol import MetricSettings
from .source import SampleSet
from .stats import compute_fid, extractor_card


def _fid(x: SampleSet, s: MetricSettings) -> list[Result]:
    r = compute_fid(x.samples, x.reference, x.extractor, device=s.device)
    return [Result(extractor_card(x.extractor).kind, {"value": r["value"]}, card={**r["protocol"], "label": r["label"]})]


FID = Metric(
    name="fid", compute=_fid, protocol=lambda s: {}, headline="value", higher_is_better=False, applies_to=SAMPLES,
    where=frozenset({"online"}),
    display=Display("FID", describe=lambda p: p["label"], column=Column(suffix="_fid", by_feature=True),
                    table_feature="proxy",
                    titles={"proxy_fid": "proxy FID of EMA samples", "inception_fid": "FID of EMA samples"}))

METRICS = (FID,)  # registered by eval/__init__.py, in this order
