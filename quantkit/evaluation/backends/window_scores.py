"""A server's scores over one prompt, read from a ``/v1/completions`` answer with ``echo``.

Both the served backend (which asks) and the served teacher-forced measures (which read the
scores) use them; neither imports the other for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from quantkit.evaluation.topk import TopK
from quantkit.serving.client import EngineError


@dataclass(frozen=True)
class WindowScores:
    """A server's predictions over one prompt: per position j, the log-probability of token j
    (``target``, NaN at j = 0, which nothing predicts) and the listed alternatives (``ids`` and
    ``logprobs``, padded with -1 / -inf; the actual token is listed too)."""
    target: np.ndarray      # [L] float64
    ids: np.ndarray         # [L, m] int64
    logprobs: np.ndarray    # [L, m] float64

    def topk(self, a: int, b: int) -> list[TopK]:
        """Positions ``[a, b)`` as ``TopK`` records."""
        return [TopK(float(self.target[j]), {int(t): float(v) for t, v in zip(self.ids[j], self.logprobs[j]) if t >= 0})
                for j in range(a, b)]

    def argmax(self, a: int, b: int) -> np.ndarray:
        """The most likely token at positions ``[a, b)``."""
        return self.ids[np.arange(a, b), self.logprobs[a:b].argmax(axis=1)]


def token_id(key: str, vocab: int = 2**31) -> int:
    if not key.startswith("token_id:"):
        raise EngineError(f"the server lists tokens as text ({key!r}), not ids: it must support vLLM's "
                          "return_tokens_as_token_ids")
    digits = key[len("token_id:"):]
    if not digits.isdigit() or int(digits) >= 2**31:
        raise EngineError(f"the server lists a token id that is not one ({key[:40]!r})")
    if int(digits) >= vocab:
        raise EngineError(f"the server lists token {digits}, past the model's vocabulary ({vocab}): it serves "
                          "another model")
    return int(digits)


def logprob(v) -> float:
    return -math.inf if v is None else float(v)


def window_scores(choice: dict, prompt: list[int], vocab: int = 2**31) -> WindowScores:
    """One choice of a ``/v1/completions`` answer with ``echo`` (validated: serving/answers.py),
    checked against its prompt: one finite log-probability for every token after the first."""
    lp = choice.get("logprobs") or {}
    tokens, n = lp.get("tokens") or [], len(prompt)
    if not lp:
        raise EngineError("the server returned no log-probabilities: it must support echo with logprobs "
                          "(vLLM's /v1/completions does)")
    if len(tokens) < n or len(lp.get("token_logprobs") or []) < n:
        raise EngineError(f"the server scored {min(len(tokens), len(lp.get('token_logprobs') or []))} of the "
                          f"prompt's {n} tokens")
    if [token_id(t) for t in tokens[:n]] != list(prompt):
        raise EngineError("the server scored other tokens than the prompt's (it must take token ids as given)")
    missing = [j for j, v in enumerate(lp["token_logprobs"][1:n], 1) if v is None]
    if missing:
        raise EngineError(f"the server gave no log-probability for prompt token {missing[0]} (of {n})")
    tops = (lp.get("top_logprobs") or [])[:n]
    m = max([len(t) for t in tops if t] or [1])
    ids, vals = np.full((n, m), -1, dtype=np.int64), np.full((n, m), -np.inf)
    for j, top in enumerate(tops):
        for c, (key, v) in enumerate((top or {}).items()):
            ids[j, c], vals[j, c] = token_id(key, vocab), logprob(v)
    target = np.array([math.nan] + [logprob(v) for v in (lp.get("token_logprobs") or [])[1:n]])
    return WindowScores(target, ids, vals)
