"""The requests a load test sends: lengths drawn from the fitted length model, text from the log.

Each request's prompt length and output length are drawn (with a seed) from the log-normals fitted
to the log (lengths.py). Its prompt is made of the log's own prompts, as token ids: starting at a
row picked with the seed, the rendered prompts of that row and the rows after it are joined until
the drawn length is reached, then cut there. A request thus begins as a real one does (template,
system prompt), so prefix caching meets the sharing real traffic has. The load generator sends
text, so the cut tokens are decoded and kept only when the text tokenizes back to exactly them
(a cut inside a character's bytes, or a join the tokenizer merges, would change the length):
otherwise the window moves on by a token, up to ``SHIFTS`` times, then starts from another row
(counted). The server thus sees exactly the drawn number of prompt tokens.

The output length is enforced with ``max_tokens`` and the engine's ignore-EOS option. A request
whose prompt and output exceed the served context is counted (``too_long``) and not sent: it is
never cut to fit, which would send a load the log does not have.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Iterator

from quantkit.errors import QuantkitError
from quantkit.loadtest.lengths import LogNormal

SHIFTS = 8   # tokens a window may move on to find a cut whose text tokenizes back to itself
ROWS_TRIED = 32   # rows a window may start from before the log is refused


@dataclass(frozen=True)
class LoadRequest:
    """One request as the server gets it."""
    prompt: list[int] | str    # text that tokenizes to exactly ``prompt_tokens`` ids, or the ids
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


def joined_prompt(rows: list[list[int]], start: int, length: int, skip: int = 0) -> list[int]:
    """``length`` tokens from the log's prompts joined from row ``start`` on (wrapping round),
    after the first ``skip`` of them.

    >>> joined_prompt([[1, 2], [3], [4, 5, 6]], 1, 5), joined_prompt([[1, 2], [3], [4, 5, 6]], 1, 2, skip=1)
    ([3, 4, 5, 6, 1], [4, 5])
    """
    out: list[int] = []
    i = start
    while len(out) < length + skip:
        out.extend(rows[i % len(rows)])
        i += 1
    return out[skip:skip + length]


def round_trip_text(tokenizer: Any, ids: list[int]) -> str | None:
    """The text of ``ids`` when it tokenizes back to exactly ``ids``, else None."""
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return text if tokenizer(text)["input_ids"] == list(ids) else None


# draws in a row that may all be too long for the served context before the stream gives up: at a
# context where one request in a thousand fits, a step of 64 requests would need 64,000 draws
MAX_DRAWS_PER_FIT = 1000


class RequestStream:
    """Reproducible requests: the same seed gives the same requests in the same order, so a
    baseline and a candidate get exactly the same load.

    The lengths are one seeded sequence of (prompt, output) pairs, those too long for the served
    context left out (``too_long`` counts them); ``take(n)`` gives requests of its first ``n`` pairs,
    each time with new prompt windows. The steps of a ramp thus carry the same lengths (a long-tailed
    draw of 16 requests would otherwise move throughput more than the concurrency does) and new
    texts (a prompt sent again would meet the prefix cache).
    """

    def __init__(self, rows: list[list[int]], model: LengthModel, seed: int = 0, tokenizer: Any = None) -> None:
        if not rows or not any(rows):
            raise ValueError("no prompt tokens to build requests from")
        self.rows, self.model, self.seed, self.tokenizer = rows, model, seed, tokenizer
        self.too_long = 0
        self.no_clean_cut = 0   # windows moved on: none of the drawn length tokenized back to itself
        self._pairs: list[tuple[int, int]] = []
        self._lengths = self._draw_lengths()
        self._starts = random.Random(seed + 1)

    def _draw_lengths(self) -> Iterator[tuple[int, int]]:
        """Length pairs that fit the served context; one line when ``MAX_DRAWS_PER_FIT`` draws in a
        row do not (a context far below the traffic's lengths: the draw would never end)."""
        rng = random.Random(self.seed)
        misses = 0
        while True:
            p = max(1, round(rng.lognormvariate(self.model.prompt.mu, self.model.prompt.sigma)))
            o = max(1, round(rng.lognormvariate(self.model.output.mu, self.model.output.sigma)))
            if p + o > self.model.max_model_len:
                self.too_long += 1
                misses += 1
                if misses >= MAX_DRAWS_PER_FIT:
                    raise QuantkitError(f"--max-model-len: {self.model.max_model_len} tokens: not one of "
                                        f"{MAX_DRAWS_PER_FIT} requests drawn from the traffic's lengths fits the "
                                        "served context")
                continue
            misses = 0
            yield p, o

    def _prompt(self, start: int, length: int) -> list[int] | str | None:
        if self.tokenizer is None:
            return joined_prompt(self.rows, start, length)
        for skip in range(SHIFTS):
            text = round_trip_text(self.tokenizer, joined_prompt(self.rows, start, length, skip))
            if text is not None:
                return text
        return None

    def _window(self, length: int) -> list[int] | str:
        for _ in range(ROWS_TRIED):
            prompt = self._prompt(self._starts.randrange(len(self.rows)), length)
            if prompt is not None:
                return prompt
            self.no_clean_cut += 1
        raise QuantkitError(f"--traffic: no window of {length} prompt tokens of the log tokenizes back to itself "
                            f"(tried {ROWS_TRIED} rows)")

    def take(self, n: int) -> list[LoadRequest]:
        """Requests of the first ``n`` length pairs, with new prompt windows."""
        while len(self._pairs) < n:
            self._pairs.append(next(self._lengths))
        return [LoadRequest(self._window(p), p, o) for p, o in self._pairs[:n]]
