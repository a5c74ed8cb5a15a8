"""The served backend: the baseline and the candidate behind an OpenAI-compatible server (vLLM's,
started by quantkit or run by the user), scored one after the other.

A server answers a prompt of token ids with, per position, the log-probability of the actual
token and of the ``top_k`` most likely ones (``echo`` with ``logprobs``; token ids, not text,
through vLLM's ``return_tokens_as_token_ids``), and greedy continuations (``temperature`` 0,
``return_token_ids``). From these: perplexity, top-1 agreement and focus measures exactly, KL
estimated from both models' top-k lists (topk.py), generation agreement, multiple choice by the
options' log-likelihood, extraction F1 and code pass rate (the code still runs in the sandbox).

The two models are served in turn, one server at a time (a GPU holds one model): the baseline's
pass (``replay=False``) records what each call of the suite gave; the candidate's pass makes the
same calls in the same order and pairs its answers with the recorded ones. What the first pass
returns pairs the baseline with itself and is thrown away.
"""
from __future__ import annotations

import hashlib
import json
import threading
from functools import partial
from typing import Callable, ContextManager, Mapping, Protocol

import numpy as np

from quantkit.common.concurrency import at_once
from quantkit.common.crashpoints import kill_point
from quantkit.errors import QuantkitError
from quantkit.evaluation.backends.base import CodeRequest, Continuation, PairedRuns
from quantkit.evaluation.backends.served_forced import PathCheck, served_forced
from quantkit.evaluation.backends.window_scores import WindowScores, logprob, token_id, window_scores
from quantkit.evaluation.code_exec import STOP
from quantkit.evaluation.forced import Encoded, ForcedRequest, ForcedResult, View, forced_jobs
from quantkit.evaluation.task_metrics import CodeExecution, chat_ids, code_result, extraction_result, mc_continuations
from quantkit.serving.client import EngineError, Endpoint

REQUESTS_IN_FLIGHT = 16   # the server batches what arrives together (16: what the in-process path batches for generation)
# Slices scored at the same time (and within each, its texts beside its tasks), each call with its
# own requests in flight: a server runs every sequence in flight in one step, and a step can cost
# the same for 1 sequence as for 8 (vLLM's CPU FP8 path, docs/engine.md), so decoding them
# together takes about the time of the longest. 16: every slice of the default suite at once.
SLICES_AT_ONCE = 16


def _in_parallel(fn: Callable, items: list) -> list:
    """``[fn(x) for x in items]``, ``REQUESTS_IN_FLIGHT`` at a time."""
    return at_once([partial(fn, x) for x in items], REQUESTS_IN_FLIGHT, "quantkit-request")


class ServedModel:
    """One model behind ``endpoint``: prompts of token ids scored and continued greedily."""

    def __init__(self, endpoint: Endpoint, tokenizer, top_k: int, timeout_s: float = 1800.0,
                 failure_note: Callable[[], str] | None = None, vocab: int | None = None) -> None:
        self.endpoint, self.tokenizer, self.top_k, self.timeout_s = endpoint, tokenizer, top_k, timeout_s
        # token ids past the model's vocabulary come from another model: refused, never scored
        self.vocab = vocab or 2**31
        self.eos = tokenizer.eos_token_id
        self._closed = threading.Event()
        # what a failed request adds, when quantkit started the server: the engine's own last error line
        self.failure_note = failure_note
        # told the count after every answer (the progress bar: a pass's slices end together, late)
        self.on_answer: Callable[[int], None] | None = None
        self.answered = 0
        self._count = threading.Lock()

    def close(self) -> None:
        """No more requests: a slice still scoring in another thread fails at its next one (after
        an error, Ctrl-C or SIGTERM nothing goes on asking the server)."""
        self._closed.set()

    def _completions(self, body: dict) -> dict:
        if self._closed.is_set():
            raise EngineError(f"{self.endpoint.flag}: the evaluation has stopped")
        try:
            answer = self.endpoint.completions(body, self.timeout_s, self._closed)
        except EngineError as e:
            if self.failure_note is None or self._closed.is_set():
                raise
            raise EngineError(f"{e}{self.failure_note()}") from None
        with self._count:
            self.answered += 1
            if self.on_answer is not None:
                self.on_answer(self.answered)
        return answer

    def score(self, seqs: list[list[int]], k: int | None = None) -> list[WindowScores]:
        k = self.top_k if k is None else k

        def one(seq: list[int]) -> WindowScores:
            answer = self._completions({"prompt": seq, "echo": True, "logprobs": k, "max_tokens": 0,
                                        "temperature": 0, "return_tokens_as_token_ids": True})
            try:
                return window_scores(answer["choices"][0], seq, self.vocab)
            except EngineError as e:   # the answer's fault: name the server that gave it
                raise EngineError(f"{self.endpoint.flag}: {self.endpoint.url}/v1/completions: {e}") from None
        out = _in_parallel(one, seqs)
        kill_point("engine:scoring")
        return out

    def next_token(self, prompts: list[list[int]]) -> list[dict[int, float]]:
        """Per prompt, the ``top_k`` most likely next tokens and their log-probabilities."""
        def one(prompt: list[int]) -> dict[int, float]:
            answer = self._completions({"prompt": prompt, "max_tokens": 1, "logprobs": self.top_k,
                                        "temperature": 0, "return_tokens_as_token_ids": True})
            tops = (answer["choices"][0].get("logprobs") or {}).get("top_logprobs") or [{}]
            try:
                return {token_id(t, self.vocab): logprob(v) for t, v in (tops[0] or {}).items()}
            except EngineError as e:
                raise EngineError(f"{self.endpoint.flag}: {self.endpoint.url}/v1/completions: {e}") from None
        return _in_parallel(one, prompts)

    def generate(self, prompts: list[list[int]], n_tokens: int, stop: list[str] | None = None) -> list[list[int]]:
        """Greedy continuations, cut before the first EOS (as the in-process path cuts them)."""
        def one(prompt: list[int]) -> list[int]:
            body = {"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "return_token_ids": True,
                    **({"stop": stop} if stop else {})}
            ids = self._completions(body)["choices"][0].get("token_ids")
            if ids is None:   # asking for logprobs instead would double vLLM's decoding time, measured
                raise EngineError(f"{self.endpoint.flag}: {self.endpoint.url} returns no token ids: it must support "
                                  "vLLM's return_token_ids")
            ids = list(ids)
            return ids[:ids.index(self.eos)] if self.eos is not None and self.eos in ids else ids
        return _in_parallel(one, prompts)


def mc_picks(model: ServedModel, tokenizer, items: list[dict]) -> list[int]:
    """Per item, the choice whose letter (" A".." D") is most likely after the question, as
    ``tasks.multiple_choice`` picks it in process.

    Where every letter is one token, one request per question gives the top-k next tokens: the
    most likely letter listed there is the pick (an unlisted letter is less likely than every
    listed token). Otherwise, or when no letter is listed, one prompt per option (question + its
    letter), scored: a server gives the log-probability of the tokens it is sent."""
    asked = [mc_continuations(tokenizer, it) for it in items]
    single = [k for k, (_, conts) in enumerate(asked) if all(len(c) == 1 for c in conts)]
    picks: dict[int, int] = {}
    for k, top in zip(single, model.next_token([asked[k][0] for k in single])):
        listed = [(top[c[0]], i) for i, c in enumerate(asked[k][1]) if c[0] in top]
        if listed:
            picks[k] = max(listed, key=lambda x: (x[0], -x[1]))[1]
    rows = [(k, c, ctx) for k, (ctx, conts) in enumerate(asked) if k not in picks for c in conts]
    best: dict[int, list[float]] = {}
    for (k, c, ctx), sc in zip(rows, model.score([ctx + c for _, c, ctx in rows], 0) if rows else []):
        best.setdefault(k, []).append(float(np.sum(sc.target[len(ctx):len(ctx) + len(c)])))
    picks.update({k: max(range(len(v)), key=v.__getitem__) for k, v in best.items()})
    return [picks[k] for k in range(len(items))]


def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


class ServedPass:
    """One model's pass over the suite, as a ``ScoringBackend`` (see the module's docstring).

    ``record`` is shared by the two passes; ``path`` (candidate's pass only) also scores the
    candidate's windows in this process, for the path agreement."""

    def __init__(self, model: ServedModel, record: dict, replay: bool, path: PathCheck | None = None) -> None:
        self.model, self.record, self.replay, self.path = model, record, replay, path
        self.tokenizer = model.tokenizer

    def _paired(self, key: str, compute: Callable):
        got = compute()
        if not self.replay:
            self.record[key] = got
            return got, got
        if key not in self.record:
            raise QuantkitError("engine evaluation: the candidate's pass asked what the baseline's did not")
        return self.record.pop(key), got

    def teacher_forced(self, encoded: list[Encoded], request: ForcedRequest,
                       views: Mapping[str, View] | None = None) -> ForcedResult:
        if views:
            raise QuantkitError("--kv: views of the candidate are not measured in the engine")
        jobs = list(forced_jobs(encoded, request.max_len))
        seqs = [encoded[k].ids[w.start:w.end] for k, w in jobs]
        base, cand = self._paired(_digest("forced", seqs), lambda: self.model.score(seqs))
        path = self.path.figures(encoded, jobs, cand) if self.replay and self.path is not None else None
        return served_forced(encoded, request, jobs, base, cand, path)

    def continuations(self, prompts: list[list[int]], n_tokens: int, batch: int) -> list[Continuation]:
        base, cand = self._paired(_digest("gen", prompts, n_tokens), lambda: self.model.generate(prompts, n_tokens))
        return [Continuation(p, a, b, n_tokens) for p, a, b in zip(prompts, base, cand)]

    def multiple_choice(self, items: list[dict]) -> PairedRuns:
        base, cand = self._paired(_digest("mc", items), lambda: mc_picks(self.model, self.tokenizer, items))
        return PairedRuns(items, base, cand)

    def extraction(self, items: list[dict], n_tokens: int, batch: int) -> PairedRuns:
        def replies() -> list[dict]:
            gens = self.model.generate([chat_ids(self.tokenizer, it["prompt"]) for it in items], n_tokens)
            return [extraction_result(self.tokenizer, it, g) for it, g in zip(items, gens)]
        base, cand = self._paired(_digest("extract", items, n_tokens), replies)
        return PairedRuns(items, base, cand)

    def code(self, items: list[dict], request: CodeRequest) -> PairedRuns:
        def completions() -> list[dict]:
            # OpenAI's API takes at most 4 stop strings: the first 4 of STOP end most bodies early, and
            # truncate_completion cuts at all of them after, as in quantkit's own path
            gens = self.model.generate([self.tokenizer(it["prompt"])["input_ids"] for it in items], request.n_tokens,
                                       stop=list(STOP[:4]))
            run = CodeExecution(request.runner, request.timeout_s)
            return [code_result(self.tokenizer, it, g, run) for it, g in zip(items, gens)]
        base, cand = self._paired(_digest("code", items, request.n_tokens), completions)
        return PairedRuns(items, base, cand)


class ServedModels(Protocol):
    """The two models as ``evaluate_served`` drives them: each served inside its own context (a
    server started for it and stopped after, or the user's endpoint), the deployment length they
    accept, and what the report says about them."""
    max_len: int
    max_len_source: str
    max_window: int             # the longest prompt the servers score
    baseline_folder: object     # the baseline's folder (its model card names the languages that gate)

    def baseline(self) -> ContextManager[ServedModel]: ...
    def candidate(self) -> ContextManager[ServedModel]: ...
    def path_check(self) -> PathCheck | None: ...
    def settings(self) -> dict: ...
    def not_measured(self) -> list[str]: ...
