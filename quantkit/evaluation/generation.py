"""Greedy generation agreement: both models continue the same prompts for N tokens.

Agreement of one prompt is the length of the common prefix of the two continuations
divided by N (after EOS both stop: equal stops count as agreement to the end).
"""
from __future__ import annotations

from .models import greedy
from .pair import both


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


def generation_agreement(base, cand, prompts: list[list[int]], n_tokens: int, pad: int, eos: int | None,
                         batch: int, progress=None) -> dict:
    scores, examples = [], []
    for s in range(0, len(prompts), batch):
        chunk = prompts[s:s + batch]
        gb, gc = both(lambda m: greedy(m, chunk, n_tokens, pad, eos), base, cand)
        for p, a, b in zip(chunk, gb, gc):
            scores.append(prefix_agreement(a, b, n_tokens))
            examples.append({"prompt": p, "base": a, "cand": b, "agreement": scores[-1]})
        if progress is not None:
            progress(len(chunk))
    return {"gen_agreement": sum(scores) / len(scores) if scores else None,
            "gen_prompts": len(scores), "examples": examples}
