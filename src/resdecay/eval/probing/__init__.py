"""The field's probes on frozen features (docs/probing.md): attentive heads on tokens (``heads.py``, trained by
``train.py`` from a ``tokens.TokenStore``), the swept linear heads, the kNN sweep and few-shot (``sweep.py``), the
``probing`` source that extracts once and carves the validation split (``source.py``), the metrics (``metrics.py``)
and the leaderboard row (``leaderboard.py``)."""
