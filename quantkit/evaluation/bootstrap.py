"""Bootstrap intervals over a slice's rows: how far a measure could move with other rows of the
same traffic. Rows, not tokens, are resampled: a row's tokens share its context and its
errors, so resampling tokens would give an interval far too narrow.

Each measure is a ratio of sums over rows (KL and top-1 per scored token; the perplexity change
is ``exp(sum(nll_cand - nll_base) / tokens) - 1``, exactly ``ppl_cand / ppl_base - 1``). The
interval is the percentile interval of ``REPLICATES`` resamples, from a fixed seed: one slice
gives one interval, run after run.
"""
from __future__ import annotations

import math

import numpy as np

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
    """``<measure>_ci`` for kl_mean, top1_agreement and ppl_increase from per-row ``ItemStats``."""
    tokens = [s.tokens for s in items]
    out = {}
    kl = ratio_interval([s.kl_sum for s in items], tokens)
    if kl is None:
        return out
    out["kl_mean_ci"] = list(kl)
    out["top1_agreement_ci"] = list(ratio_interval([s.top1 for s in items], tokens))
    lo, hi = ratio_interval([s.nll_cand - s.nll_base for s in items], tokens)
    out["ppl_increase_ci"] = [math.expm1(lo), math.expm1(hi)]
    return out
