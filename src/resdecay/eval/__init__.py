"""Representation measurements: kNN accuracy, effective rank, feature extraction."""

from .features import extract_features, pool_tokens
from .knn import knn_accuracy, knn_scores
from .rank import effective_rank

__all__ = ["effective_rank", "extract_features", "knn_accuracy", "knn_scores", "pool_tokens"]
