"""Bootstrap intervals over a slice's rows: how far a measure could move with other rows of the
same traffic, or (for a measure over a few prompts: greedy agreement, extraction) with other
prompts. Rows, not tokens, are resampled: a row's tokens share its context and its
errors, so resampling tokens would give an interval far too narrow.

Each measure is a ratio of sums over rows (KL and top-1 per scored token; the perplexity change
is ``exp(sum(nll_cand - nll_base) / tokens) - 1``, exactly ``ppl_cand / ppl_base - 1``). The
interval is the percentile interval of ``REPLICATES`` resamples, from a fixed seed: one slice
gives one interval, run after run.
"""
from __future__ import annotations

import numpy as np

from quantkit.evaluation.measures import MEASURES

REPLICATES = 1000
LEVEL = 0.95
SEED = 0


def ratio_interval(num, den, replicates: int = REPLICATES, level: float = LEVEL,
                   seed: int = SEED) -> tuple[float, float] | None:
    """Percentile interval of ``sum(num) / sum(den)`` over rows resampled with replacement
    (None for fewer than 2 rows with a denominator).

    >>> ratio_interval([1.0, 1.0, 1.0], [10, 10, 10])
    (0.1, 0.1)
    >>> lo, hi = ratio_interval([0.0, 1.0, 2.0, 3.0], [1, 1, 1, 1]); lo < 1.5 < hi
    True
    """
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    keep = den > 0
    num, den = num[keep], den[keep]
    if num.size < 2:
        return None
    picks = np.random.default_rng(seed).integers(0, num.size, size=(replicates, num.size))
    ratios = num[picks].sum(axis=1) / den[picks].sum(axis=1)
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def row_intervals(items) -> dict[str, list[float]]:
    """``<measure>_ci`` from per-row ``ItemStats`` for each registered measure with a
    ``row_value`` (kl_mean, top1_agreement, ppl_increase); none with fewer than 2 scored rows."""
    tokens = [s.tokens for s in items]
    out = {}
    for m in MEASURES.values():
        if m.row_value is None:
            continue
        ci = ratio_interval([m.row_value(s) for s in items], tokens)
        if ci is not None:
            out[f"{m.name}_ci"] = [m.from_ratio(x) for x in ci] if m.from_ratio else list(ci)
    return out


def prompt_intervals(scored) -> dict[str, list[float]]:
    """``<measure>_ci`` over prompts for each registered measure with a ``per_prompt`` that applies
    to the scored slice (``backends.base.ScoredSlice``): gen_agreement, extract_f1_drop."""
    out = {}
    for m in MEASURES.values():
        if m.per_prompt is not None and m.applies(scored):
            out.update(prompt_interval(m.name, m.per_prompt(scored)))
    return out


def prompt_interval(measure: str, values: list[float]) -> dict[str, list[float]]:
    """``<measure>_ci`` for a mean over prompts (each prompt a row of weight 1); none for fewer
    than 2 prompts.

    >>> prompt_interval("gen_agreement", [1.0, 1.0])
    {'gen_agreement_ci': [1.0, 1.0]}
    """
    ci = ratio_interval(values, [1.0] * len(values))
    return {} if ci is None else {f"{measure}_ci": list(ci)}
