"""Unsupervised segmentation (the paper's protocol, docs/segmentation.md): the clustering and matching
(``segment.py``: ``SegProtocol``, ``segment``), the ``segmentation`` source of patch tokens and label maps
(``source.py``) and its metric (``metric.py``)."""
