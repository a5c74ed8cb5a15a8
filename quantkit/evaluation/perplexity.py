"""Rolling-window perplexity: long texts are scored in windows of at most ``max_len``
tokens, each window overlapping the previous by ``max_len - stride`` tokens of context,
so that every token is scored exactly once with as much context as the window allows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Window:
    start: int        # first token of the window in the text
    end: int          # one past the last token
    score_from: int   # first *target* position (within the window) that is scored here


def rolling_windows(n_tokens: int, max_len: int, stride: int | None = None) -> list[Window]:
    """Windows over ``n_tokens`` tokens; targets are tokens 1..n-1 (token 0 has no context).

    >>> rolling_windows(10, 4, 2)
    [Window(start=0, end=4, score_from=0), Window(start=2, end=6, score_from=1), \
Window(start=4, end=8, score_from=1), Window(start=6, end=10, score_from=1)]
    """
    if max_len < 2:
        raise ValueError("max_len must be at least 2")
    # windows must overlap by a token: a window's first token has no prediction inside it
    stride = min(stride or max(1, max_len // 2), max_len - 1)
    windows, scored_to = [], 1  # next token index (in the text) that needs a score
    start = 0
    while scored_to < n_tokens:
        end = min(start + max_len, n_tokens)
        # target position p in the window predicts token start + p + 1
        windows.append(Window(start, end, scored_to - start - 1))
        scored_to = end
        if end == n_tokens:
            break
        start += stride
    return windows


def perplexity(total_nll: float, n_tokens: int) -> float:
    return math.exp(total_nll / n_tokens) if n_tokens else float("nan")
