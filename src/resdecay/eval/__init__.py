"""Representation measurements. At the top, the registry core every evaluator iterates: input sources
(``sources.py``), metrics (``metrics.py``), their options, display and protocol constants, ``resdecay eval``
(``suite.py``), reports, ``compare`` and online tracking. Below it, one folder per pipeline: ``features/``
(kNN, probe, rank, baselines), ``fid/``, ``diffusion/`` (the probe grid), ``segmentation/``, ``diagnostics/``.

Importing the package registers the built-in sources and metrics, in the order that is the column order
of every table: features, layers, blocks; samples (FID); diffusion; segmentation; diagnostics.
"""

from .diagnostics import metric as diagnostics_metric
from .diagnostics import source as diagnostics_source
from .diffusion import metric as diffusion_metric
from .diffusion import source as diffusion_source
from .features import metrics as features_metrics
from .features import source as features_source
from .features.extract import extract_block_features, pool_tokens
from .features.knn import knn_accuracy, knn_scores
from .features.rank import effective_rank
from .fid import metric as fid_metric
from .fid import source as fid_source
from .metrics import Metric, register_metric, unregister_metric
from .probing import metrics as probing_metrics
from .probing import source as probing_source
from .segmentation import metric as segmentation_metric
from .segmentation import source as segmentation_source
from .sets import BlockStats, FeatureSet, LayerSet
from .sources import Prepared, Source, register_source, unregister_source

# The built-ins, registered here in the order that is every table's column order (a plugin's come after).
for _source in (*features_source.SOURCES, *fid_source.SOURCES, *diffusion_source.SOURCES, *segmentation_source.SOURCES,
                *diagnostics_source.SOURCES, *probing_source.SOURCES):
    register_source(_source)
for _metric in (*features_metrics.METRICS, *fid_metric.METRICS, *diffusion_metric.METRICS, *segmentation_metric.METRICS,
                *diagnostics_metric.METRICS, *probing_metrics.METRICS):
    register_metric(_metric)

__all__ = ["BlockStats", "FeatureSet", "LayerSet", "Metric", "Prepared", "Source", "effective_rank",
           "extract_block_features", "knn_accuracy", "knn_scores", "pool_tokens", "register_metric", "register_source",
           "unregister_metric", "unregister_source"]
