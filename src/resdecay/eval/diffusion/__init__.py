"""The diffusion probe: linear probes of a diffusion model's blocks at several noise levels (``probe.py``,
``resdecay eval-diffusion``), and the ``diffusion`` source and best-cell metric of online tracking."""
