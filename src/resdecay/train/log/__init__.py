"""What a run logs: ``log.jsonl`` and the loss window (``runlog``), and the experiment trackers it
sends every row to (``tracking`` chooses and fans out; ``trackers``: TensorBoard and CSV;
``remote_trackers``: W&B and MLflow)."""
