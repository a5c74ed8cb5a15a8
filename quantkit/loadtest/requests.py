"""The requests a load test sends: lengths drawn from the fitted length model, text from the log.

Each request's prompt length and output length are drawn (with a seed) from the log-normals fitted
to the log (lengths.py). Its prompt is made of the log's own prompts, as token ids: starting at a
row picked with the seed, the rendered prompts of that row and the rows after it are joined until
the drawn length is reached, then cut there. A request thus begins as a real one does (template,
system prompt), so prefix caching meets the sharing real traffic has, and its length is exact:
token ids are sent, not text that the server would tokenize again.

The output length is enforced with ``max_tokens`` and the engine's ignore-EOS option. A request
whose prompt and output exceed the served context is counted (``too_long``) and not sent: it is
never cut to fit, which would send a load the log does not have.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Iterator

from quantkit.loadtest.lengths import LogNormal


@dataclass(frozen=True)
class LoadRequest:
    """One request as the server gets it."""
    prompt: list[int]
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class LengthModel:
    """Both directions' fits, and the context the server serves."""
    prompt: LogNormal
    output: LogNormal
    max_model_len: int


def prompt_ids(prompts: list[str], tokenizer: Any) -> list[list[int]]:
    """Each rendered prompt's token ids (special tokens as the template wrote them)."""
    bos = getattr(tokenizer, "bos_token", None)
    return [tokenizer(p, add_special_tokens=not (bos and p.startswith(bos)))["input_ids"] for p in prompts]


def joined_prompt(rows: list[list[int]], start: int, length: int) -> list[int]:
    """``length`` tokens from the log's prompts joined from row ``start`` on (wrapping round).

    >>> joined_prompt([[1, 2], [3], [4, 5, 6]], 1, 5)
    [3, 4, 5, 6, 1]
    """
    out: list[int] = []
    i = start
    while len(out) < length:
        out.extend(rows[i % len(rows)])
        i += 1
    return out[:length]


class RequestStream:
    """An endless, reproducible sequence of requests: the same seed gives the same requests in
    the same order, so a baseline and a candidate get exactly the same load."""

    def __init__(self, rows: list[list[int]], model: LengthModel, seed: int = 0) -> None:
        if not rows or not any(rows):
            raise ValueError("no prompt tokens to build requests from")
        self.rows, self.model, self.seed = rows, model, seed
        self.too_long = 0
        self._drawn = self._draw()

    def _draw(self) -> Iterator[LoadRequest]:
        rng = random.Random(self.seed)
        while True:
            p = max(1, round(rng.lognormvariate(self.model.prompt.mu, self.model.prompt.sigma)))
            o = max(1, round(rng.lognormvariate(self.model.output.mu, self.model.output.sigma)))
            start = rng.randrange(len(self.rows))
            if p + o > self.model.max_model_len:
                self.too_long += 1
                continue
            yield LoadRequest(joined_prompt(self.rows, start, p), p, o)

    def take(self, n: int) -> list[LoadRequest]:
        """The next ``n`` requests that fit the served context."""
        return [next(self._drawn) for _ in range(n)]
