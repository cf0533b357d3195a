"""A run's folder and what it says about itself: the folder created, locked and cleaned up after a
failed start (``run_folder``, ``runlock``), what an earlier run left there (``previous_run``), whether
the model fits in memory (``capacity``), the header, ``summary.json`` and ``pretrained.json`` (``summary``)
and the numerics environment the exact numbers depend on (``environment``)."""
