"""The layer-by-layer runner, one concept per module.

- ``batches``: calibration samples packed into rows, rows into batches;
- ``onload``: the model as a meta skeleton, one layer materialised from the shards at a time;
- ``capture``: layer 0's hidden states and every layer's call arguments;
- ``store``: the hidden states between layers (in memory or offloaded);
- ``passes``: one layer run over the calibration batches (what steps observe through);
- ``record``: transform results saved beside the checkpoint and re-applied;
- ``calibrate``: the calibration set cut into batches, every layer's inputs captured;
- ``state``: what one run's layers share (``RunOptions``, ``RunState``);
- ``layer_steps``: a layer's targets and context, its transforms and quantizer;
- ``layer_writer``: a layer's tensors, then config.json and quantization_log.json;
- ``stream``: a layer over the memory budget, its experts a chunk at a time;
- ``runner``: the layer loop.
"""

from quantkit.pipeline.batches import CalibrationChunk, auto_batch_tokens, make_chunks, num_tokens_of, pack_rows
from quantkit.pipeline.onload import build_skeleton, config_dtype
from quantkit.pipeline.runner import PipelineResult, RunOptions, build_steps, peak_rss_bytes, run_pipeline

__all__ = ["CalibrationChunk", "PipelineResult", "RunOptions", "auto_batch_tokens", "build_skeleton", "build_steps", "config_dtype",
           "make_chunks", "num_tokens_of", "pack_rows", "peak_rss_bytes", "run_pipeline"]
