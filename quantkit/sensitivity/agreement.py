"""How well a cheap score ranks units like the exact KL does: Spearman's rank correlation.

    >>> spearman([1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0])
    0.8
    >>> spearman([1.0, 1.0, 2.0], [5.0, 6.0, 7.0])    # ties take their mean rank
    0.866
"""

from __future__ import annotations

import torch


def ranks(xs: list[float]) -> torch.Tensor:
    """1-based ranks, ties given the mean of the ranks they span."""
    x = torch.tensor(xs, dtype=torch.float64)
    order = torch.argsort(x, stable=True)
    r = torch.empty_like(x)
    r[order] = torch.arange(1, len(xs) + 1, dtype=torch.float64)
    for v in torch.unique(x):
        tied = x == v
        if int(tied.sum()) > 1:
            r[tied] = r[tied].mean()
    return r


def spearman(a: list[float], b: list[float]) -> float:
    """Pearson correlation of the ranks, rounded to 3 places (nan for fewer than 2 items)."""
    if len(a) != len(b):
        raise ValueError(f"spearman: {len(a)} and {len(b)} values")
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(ra.norm() * rb.norm())
    return round(float((ra * rb).sum()) / den, 3) if den > 0 else float("nan")
