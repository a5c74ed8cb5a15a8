"""The length model: a log-normal fitted to a long-tailed log reproduces its P50/P90/P99 within
10%, and the lengths drawn from the fit reproduce the fit."""
from __future__ import annotations

import math
import random

import pytest

from quantkit.errors import QuantkitError
from quantkit.loadtest.lengths import LogNormal, fit_lognormal, length_summary, percentile


def _long_tailed_log(n: int, seed: int) -> list[int]:
    """Prompt lengths as a chat service sees them: most short, a tail of long documents (a
    log-normal body, sigma 1.1 around 180 tokens, with 3% of documents from a second, longer one)."""
    rng = random.Random(seed)
    return [max(1, round(rng.lognormvariate(math.log(1500) if rng.random() < 0.03 else math.log(180), 1.1)))
            for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fit_reproduces_a_long_tailed_logs_quantiles_within_10_percent(seed):
    lengths = _long_tailed_log(20000, seed)
    summary = length_summary(lengths, fit_lognormal(lengths))
    for q in ("p50", "p90", "p99"):
        assert abs(summary[q]["error"]) <= 0.10, (q, summary[q])
    assert summary["p99"]["empirical"] > 10 * summary["p50"]["empirical"]   # the tail is long


def test_lengths_drawn_from_the_fit_match_it():
    fit = fit_lognormal(_long_tailed_log(5000, 2))
    drawn = fit.draw(20000, seed=3)
    for q in (0.5, 0.9, 0.99):
        assert percentile(drawn, q) == pytest.approx(fit.quantile(q), rel=0.06)
    assert fit.draw(5, seed=3) == fit.draw(5, seed=3) and min(fit.draw(2000, seed=4, hi=500)) >= 1
    assert max(fit.draw(2000, seed=4, hi=500)) == 500


def test_a_log_without_two_positive_lengths_is_refused():
    with pytest.raises(QuantkitError, match="--traffic: output lengths: 1 positive length"):
        fit_lognormal([0, 7, 0], "output lengths")


def test_a_constant_log_fits_a_point():
    fit = fit_lognormal([64] * 10)
    assert fit.sigma == 0 and fit.quantile(0.99) == pytest.approx(64) and set(LogNormal(fit.mu, 0).draw(5, 0)) == {64}
