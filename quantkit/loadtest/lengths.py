"""The length model: a log-normal distribution fitted to the prompt (or output) lengths of the
user's log, and requests drawn from it.

Fixed-length load tests overstate what a server sustains: schedulers suffer most from uneven
lengths. Production lengths are long-tailed and close to log-normal, so the load is drawn from a
log-normal fitted to the log's own P50, P90 and P99, the figures the load must match: mu = ln P50,
and sigma the one whose worst log error over P90 and P99 is smallest (z_q sigma against
ln(Pq / P50), z_q the normal quantile).
A maximum-likelihood fit (the mean and deviation of the log lengths) weighs the body and misses
a tail of long documents: P99 13-22% short on the test's log. The report sets
the fitted quantiles beside the log's, with the fit's error.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist

from quantkit.errors import QuantkitError

QUANTILES = (0.5, 0.9, 0.99)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, linearly interpolated between order statistics.

    >>> percentile([1, 2, 3, 4], 0.5), percentile([10], 0.99)
    (2.5, 10.0)
    """
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


@dataclass(frozen=True)
class LogNormal:
    """ln(length) ~ Normal(mu, sigma)."""
    mu: float
    sigma: float

    def quantile(self, q: float) -> float:
        """The length at quantile ``q`` (0-1).

        >>> round(LogNormal(math.log(100), 0.5).quantile(0.5), 6)
        100.0
        """
        return math.exp(self.mu + self.sigma * NormalDist().inv_cdf(q)) if self.sigma > 0 else math.exp(self.mu)

    def draw(self, n: int, seed: int, lo: int = 1, hi: int | None = None) -> list[int]:
        """``n`` lengths drawn with ``seed``, rounded and kept within ``[lo, hi]`` (clipped, never
        dropped: the caller counts what the clip changed)."""
        rng = random.Random(seed)
        out = [max(lo, round(rng.lognormvariate(self.mu, self.sigma))) for _ in range(n)]
        return [min(x, hi) for x in out] if hi is not None else out


def fit_lognormal(lengths: list[int], what: str = "lengths") -> LogNormal:
    """The log-normal through the P50 of ``lengths`` (positive ones, at least two) whose P90 and
    P99 are closest to theirs in log space (see the module docstring)."""
    xs = [x for x in lengths if x > 0]
    if len(xs) < 2:
        raise QuantkitError(f"--traffic: {what}: {len(xs)} positive length(s); a fit needs at least two")
    p50 = percentile(xs, 0.5)
    zs = [NormalDist().inv_cdf(q) for q in QUANTILES[1:]]
    rise = [math.log(percentile(xs, q) / p50) for q in QUANTILES[1:]]
    # the sigma whose worst log error over P90 and P99 is smallest: where the two errors are equal
    # and opposite, else (both on one side) the one that zeroes the larger
    (z1, z2), (r1, r2) = zs, rise
    sigma = (r1 + r2) / (z1 + z2)
    if (z1 * sigma - r1) * (z2 * sigma - r2) > 0:
        sigma = min(r1 / z1, r2 / z2, key=lambda x: max(abs(z1 * x - r1), abs(z2 * x - r2)))
    return LogNormal(math.log(p50), max(sigma, 0.0))


def length_summary(lengths: list[int], fit: LogNormal) -> dict:
    """The fit's parameters and, per quantile, the empirical and fitted lengths and the fit's
    relative error (what the report shows)."""
    out = {"n": len(lengths), "mu": fit.mu, "sigma": fit.sigma}
    for q in QUANTILES:
        key = f"p{round(q * 100)}"
        emp, fitted = percentile(lengths, q), fit.quantile(q)
        out[key] = {"empirical": emp, "fitted": fitted, "error": fitted / emp - 1.0 if emp else None}
    return out
