import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quantkit.evaluation.divergence import kl_by_position, position_buckets, token_stats


def test_kl_matches_hand_calculation():
    p = torch.tensor([[0.5, 0.25, 0.25]])
    q = torch.tensor([[0.25, 0.5, 0.25]])
    s = token_stats(p.log(), q.log(), torch.tensor([1]))
    hand = 0.5 * math.log(0.5 / 0.25) + 0.25 * math.log(0.25 / 0.5)
    assert abs(float(s["kl"][0]) - hand) < 1e-6
    assert abs(float(s["nll_base"][0]) - math.log(4)) < 1e-6
    assert abs(float(s["nll_cand"][0]) - math.log(2)) < 1e-6
    assert not bool(s["top1"][0])


def test_identical_logits_give_zero_kl_and_full_agreement():
    x = torch.randn(1500, 50)  # more rows than one chunk
    s = token_stats(x, x.clone(), torch.randint(0, 50, (1500,)))
    assert float(s["kl"].max()) < 1e-5 and bool(s["top1"].all())
    assert torch.allclose(s["nll_base"], s["nll_cand"])


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.integers(2, 30), st.floats(0.01, 3.0))
def test_kl_is_nonnegative_and_grows_with_noise(t, v, scale):
    g = torch.Generator().manual_seed(t * 31 + v)
    x = torch.randn(t, v, generator=g)
    noise = torch.randn(t, v, generator=g)
    small = token_stats(x, x + 0.1 * scale * noise, torch.zeros(t, dtype=torch.long))["kl"]
    big = token_stats(x, x + scale * noise, torch.zeros(t, dtype=torch.long))["kl"]
    assert float(small.min()) >= 0.0
    assert float(big.sum()) >= float(small.sum()) - 1e-6


def test_position_buckets_cover_the_length():
    edges = position_buckets(4096)
    assert edges == [0, 128, 256, 512, 1024, 2048, 4096]
    kl = torch.tensor([0.0, 1.0, 2.0, 3.0])
    rows = kl_by_position(kl, torch.tensor([5, 130, 3000, 4000]), edges)
    assert [r["tokens"] for r in rows] == [1, 1, 0, 0, 0, 2]
    assert rows[-1]["kl_mean"] == 2.5 and rows[2]["kl_mean"] is None
