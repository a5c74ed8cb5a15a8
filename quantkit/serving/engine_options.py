"""The flags of ``quantkit eval`` that move the evaluation into a serving engine
(evaluation/served_pair.py), checked before anything starts. No engine, torch or HTTP import here:
the CLI reads it at start (the registry imports the engine kinds, which import nothing heavy)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.serving.engines import engine_kind

# top-k log-probabilities per position the KL is estimated from (topk.py; benchmarks/RESULTS.md,
# the top-k KL estimator: it reads low, less with more k: 8-bit candidates -8.7% at k = 20 and
# -6.5% at 50, W4 -16% and -10%). The servers quantkit starts return 50 (--max-logprobs 50);
# a user's server 20, vLLM's default cap
ENGINE_TOP_K, ENDPOINT_TOP_K = 50, 20
NOT_MEASURED = ("KV-cache options (--kv) beside the checkpoint's own: quantkit's own path only",
                "lm-eval tasks (--lm-eval): quantkit's own path only")


@dataclass(frozen=True)
class EngineOptions:
    """Where the models are served: ``engine`` (a registered engine, started by quantkit) or the user's
    ``endpoint`` and ``baseline_endpoint``; ``python``: the engine's interpreter
    (``--engine-python``); ``dtype``: the engine's (auto: capabilities.py ``serving_dtype``);
    ``top_k``: log-probabilities per position; ``path_tokens``: tokens a slice for the path
    agreement (0: none)."""
    engine: str | None = None
    python: str | Path | None = None
    endpoint: str | None = None
    baseline_endpoint: str | None = None
    dtype: str = "auto"
    top_k: int | None = None            # None: ENGINE_TOP_K with --engine, ENDPOINT_TOP_K with --endpoint
    path_tokens: int = 4096
    startup_timeout_s: float = 900.0

    @property
    def k(self) -> int:
        """The top-k asked of the servers."""
        return self.top_k or (ENGINE_TOP_K if self.engine else ENDPOINT_TOP_K)

    @property
    def wanted(self) -> bool:
        return bool(self.engine or self.endpoint or self.baseline_endpoint)

    def check(self) -> None:
        """One line naming the flag for a combination that cannot run."""
        if self.engine is not None:
            engine_kind(self.engine)
        if self.engine and (self.endpoint or self.baseline_endpoint):
            raise QuantkitError("--engine: give either --engine (quantkit starts the servers) or --endpoint and "
                                "--baseline-endpoint (yours), not both")
        if not self.engine and bool(self.endpoint) != bool(self.baseline_endpoint):
            missing = "--baseline-endpoint" if self.endpoint else "--endpoint"
            raise QuantkitError(f"{missing}: needed: the baseline and the candidate must both be served")
        if self.python is not None and not self.engine:
            raise QuantkitError("--engine-python: only with --engine")
        if self.top_k is not None and not 1 <= self.top_k <= 100:
            raise QuantkitError(f"--top-k: expected 1-100, got {self.top_k}")
        if self.path_tokens < 0:
            raise QuantkitError(f"--path-tokens: expected 0 or more, got {self.path_tokens}")
