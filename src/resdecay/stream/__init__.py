"""Reading any model's residual stream, below the evaluation pipelines: where each residual add is (``sites``:
the blocks of the stream, every stage, and the ``Role`` each adapter states for its adds), what one forward carries
through them (``record``: hooks and the ``residual_add`` tap, feature maps read as tokens), how to run a model so
that they run (``runner``), the per-block norms of the per-layer profile (``norms``), and the contract a model
trained elsewhere is given (``foreign.ForeignEncoder``). The evaluators (``eval/``) read models only through here.
"""

from .foreign import ForeignEncoder, ForeignRun, stream_model
from .norms import block_norms
from .record import Pass, hooked, in_run_order
from .runner import model_runner, reading
from .sites import Site, SubBlock, find_sites, sites_of, stream_blocks

__all__ = ["ForeignEncoder", "ForeignRun", "Pass", "Site", "SubBlock", "block_norms", "find_sites", "hooked",
           "in_run_order", "model_runner", "reading", "sites_of", "stream_blocks", "stream_model"]
