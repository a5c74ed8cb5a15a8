"""The in-process backend: both models in this process (the packed candidate as loaded),
side by side where the machine allows it (pair.py)."""
from __future__ import annotations

from typing import Mapping

from quantkit.evaluation.backends.base import CodeRequest, Continuation, PairedRuns
from quantkit.evaluation.forced import Encoded, ForcedRequest, ForcedResult, View, run_forced
from quantkit.evaluation.causal_lm import greedy, pad_id
from quantkit.evaluation.pair import both
from quantkit.evaluation.task_metrics import CodeExecution, code_pass, extraction, multiple_choice


class InProcessBackend:
    """``ScoringBackend`` over two transformers causal LMs sharing ``tokenizer``."""

    def __init__(self, base, cand, tokenizer) -> None:
        self.base, self.cand, self.tokenizer = base, cand, tokenizer
        self.pad, self.eos = pad_id(tokenizer), tokenizer.eos_token_id

    def teacher_forced(self, encoded: list[Encoded], request: ForcedRequest,
                       views: Mapping[str, View] | None = None) -> ForcedResult:
        return run_forced(self.base, self.cand, encoded, request, self.pad, views)

    def continuations(self, prompts: list[list[int]], n_tokens: int, batch: int) -> list[Continuation]:
        out = []
        for s in range(0, len(prompts), batch):
            chunk = prompts[s:s + batch]
            gb, gc = both(lambda m: greedy(m, chunk, n_tokens, self.pad, self.eos), self.base, self.cand)
            out += [Continuation(p, a, b, n_tokens) for p, a, b in zip(chunk, gb, gc)]
        return out

    def multiple_choice(self, items: list[dict]) -> PairedRuns:
        pb, pc = both(lambda m: multiple_choice(m, self.tokenizer, items, self.pad), self.base, self.cand)
        return PairedRuns(items, pb, pc)

    def extraction(self, items: list[dict], n_tokens: int, batch: int) -> PairedRuns:
        rb, rc = both(lambda m: extraction(m, self.tokenizer, items, n_tokens, self.pad, self.eos, batch),
                      self.base, self.cand)
        return PairedRuns(items, rb, rc)

    def code(self, items: list[dict], request: CodeRequest) -> PairedRuns:
        rb, rc = both(lambda m: code_pass(m, self.tokenizer, items, request.n_tokens, self.pad, self.eos,
                                          request.batch, CodeExecution(request.runner, request.timeout_s)),
                      self.base, self.cand)
        return PairedRuns(items, rb, rc)
