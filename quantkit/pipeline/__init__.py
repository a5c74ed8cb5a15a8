"""The layer-by-layer runner, one concept per module.

- ``batches``: calibration samples packed into rows, rows into batches;
- ``onload``: the model as a meta skeleton, one layer materialised from the shards at a time;
- ``capture``: layer 0's hidden states and every layer's call arguments;
- ``store``: the hidden states between layers (in memory or offloaded);
- ``passes``: one layer run over the calibration batches (what steps observe through);
- ``record``: transform results saved beside the checkpoint and re-applied;
- ``runner``: the layer loop.
"""

from .batches import CalibrationChunk, auto_batch_tokens, make_chunks, num_tokens_of, pack_rows
from .onload import build_skeleton, config_dtype
from .runner import PipelineResult, build_steps, peak_rss_bytes, run_pipeline

__all__ = ["CalibrationChunk", "PipelineResult", "auto_batch_tokens", "build_skeleton", "build_steps", "config_dtype",
           "make_chunks", "num_tokens_of", "pack_rows", "peak_rss_bytes", "run_pipeline"]
