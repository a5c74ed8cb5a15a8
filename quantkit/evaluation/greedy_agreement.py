"""Greedy generation agreement: both models continue the same prompts for N tokens.

Agreement of one prompt is the length of the common prefix of the two continuations
divided by N (after EOS both stop: equal stops count as agreement to the end). The
continuations come from a scoring backend (backends/); ``measures/generation.py`` averages
this over a slice's prompts.
"""
from __future__ import annotations


def prefix_agreement(a: list[int], b: list[int], n_tokens: int) -> float:
    """Common-prefix length over ``n_tokens``.

    >>> prefix_agreement([1, 2, 3, 4], [1, 2, 9, 4], 4)
    0.5
    """
    if a == b:
        return 1.0
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k / n_tokens
