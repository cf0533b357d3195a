"""Fréchet distances, fully offline: the extractors (Inception-v3 from a local weights file, or the data
set's proxy CNN, ``extractors.py`` / ``proxy.py``), the statistics and the distance (``stats.py``), published
and pytorch-fid / ADM reference statistics (``published.py``), image sets on disk (``image_sets.py``), and the
``samples`` source and FID metric of online tracking (``source.py``, ``metric.py``)."""

from .extractors import (
    WEIGHTS_FIX,
    ExtractorCard,
    FeatureExtractor,
    InceptionFeatures,
    extractor_card,
    inception_extractor,
)
from .proxy import PROXY_DATASETS, PROXY_VERSION, ProxyCNN, default_cache_dir, proxy_extractor, reference_images
from .published import EXTERNAL_STATS, INCEPTION_LABEL, PUBLISHED_INCEPTION, STATS_FORMAT, inception_label, is_published
from .stats import (
    BATCH_SIZE,
    check_count,
    compute_fid,
    dataset_reference,
    feature_stats,
    feature_stats_id,
    fid,
    load_stats,
    save_stats,
)

__all__ = ["BATCH_SIZE", "EXTERNAL_STATS", "INCEPTION_LABEL", "PROXY_DATASETS", "PROXY_VERSION", "PUBLISHED_INCEPTION",
           "STATS_FORMAT", "WEIGHTS_FIX", "ExtractorCard", "FeatureExtractor", "InceptionFeatures", "ProxyCNN",
           "check_count", "compute_fid", "dataset_reference", "default_cache_dir", "extractor_card", "feature_stats",
           "feature_stats_id", "fid", "inception_extractor", "inception_label", "is_published", "load_stats",
           "proxy_extractor", "reference_images", "save_stats"]
