"""Bootstrap intervals over rows, and the verdict's note when an interval holds a limit."""
from __future__ import annotations

import numpy as np

from quantkit.evaluation.bootstrap import ratio_interval, row_intervals
from quantkit.evaluation.forced import ItemStats
from quantkit.evaluation.verdict import NOGO, REVIEW, Thresholds, decide, within_noise


def test_two_rows_by_hand():
    # resamples of rows (0 nats, 1 token) and (1 nat, 1 token): ratios 0, 1/2, 1 with odds 1:2:1
    assert ratio_interval([0.0, 1.0], [1, 1]) == (0.0, 1.0)
    assert ratio_interval([0.0, 1.0], [1, 1], level=0.4) == (0.5, 0.5)
    assert ratio_interval([3.0], [10]) is None            # one row: no spread to measure


def test_rows_not_tokens_are_resampled():
    rng = np.random.default_rng(1)
    kl = rng.gamma(2.0, 0.02, size=40)
    few_long = ratio_interval(kl * 500, np.full(40, 500))     # 40 rows of 500 tokens each
    many = ratio_interval(np.repeat(kl, 10) * 50, np.full(400, 50))
    (a, b), (c, d) = few_long, many
    assert a < kl.mean() < b and c < kl.mean() < d
    assert (d - c) < 0.6 * (b - a)                          # ten times the rows: about a third as wide
    assert few_long == ratio_interval(kl * 500, np.full(40, 500))   # fixed seed: one interval


def test_row_intervals_of_item_stats():
    items = [ItemStats("a", tokens=10, nll_base=10.0, nll_cand=11.0, kl_sum=0.5, top1=9),
             ItemStats("b", tokens=30, nll_base=30.0, nll_cand=30.0, kl_sum=0.3, top1=30)]
    ci = row_intervals(items)
    assert ci["kl_mean_ci"][0] <= 0.8 / 40 <= ci["kl_mean_ci"][1]
    assert ci["top1_agreement_ci"] == [0.9, 1.0]
    assert ci["ppl_increase_ci"][0] == 0.0 and abs(ci["ppl_increase_ci"][1] - np.expm1(0.1)) < 1e-12


def test_within_noise_names_the_limit_an_interval_holds_and_changes_nothing():
    th = Thresholds.from_dict({"kl_mean": {"review": 0.05, "nogo": 0.10}})
    measures = {"business:a": {"kl_mean": 0.045, "kl_mean_ci": [0.03, 0.06]},     # holds REVIEW
                "business:b": {"kl_mean": 0.12, "kl_mean_ci": [0.09, 0.16]},      # holds NO-GO
                "business:c": {"kl_mean": 0.02, "kl_mean_ci": [0.015, 0.03]},     # clear of both
                "numbers-en": {"kl_mean": 0.049}}                                 # no interval
    got = within_noise(measures, th)
    assert [(n["slice"], n["limit_level"], n["limit"]) for n in got] == [("business:a", REVIEW, 0.05),
                                                                         ("business:b", NOGO, 0.10)]
    assert decide(measures, th).slices == {"business:a": "GO", "business:b": NOGO, "business:c": "GO",
                                           "numbers-en": "GO"}
