"""The features pipeline: frozen pooled features extracted once (``extract.py``) and cached on disk
(``cache.py``); kNN (``knn.py``), the linear probe (``probe.py``) and effective rank (``rank.py``); the
raw-pixel and random-init baselines (``baselines.py``); the ``features``, ``layers`` and ``blocks`` inputs
(``sets.py``), their sources (``source.py``) and metrics (``metrics.py``)."""

from ..sets import BlockStats, FeatureSet, LayerSet

__all__ = ["BlockStats", "FeatureSet", "LayerSet"]
