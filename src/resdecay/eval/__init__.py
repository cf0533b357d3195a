"""Representation measurements: kNN accuracy, effective rank, feature extraction, and the metric
registry every evaluator iterates (``metrics.py``; the built-in metrics register on import here)."""

from . import builtin_metrics  # noqa: F401  (registers kNN, probe, rank, ... before anyone reads the registry)
from .features import extract_block_features, pool_tokens
from .knn import knn_accuracy, knn_scores
from .metrics import Metric, register_metric
from .rank import effective_rank

__all__ = ["Metric", "effective_rank", "extract_block_features", "knn_accuracy", "knn_scores", "pool_tokens",
           "register_metric"]
