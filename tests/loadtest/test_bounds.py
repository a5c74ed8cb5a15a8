"""Every loop of a load test is bounded by its own limits: the length draw by a served context that
fits none of the traffic, a step by its request count, a ramp by a finite time, an SLO by finite
bounds; each refusal is one line naming the flag."""
from __future__ import annotations

import math

import pytest

from quantkit.errors import QuantkitError
from quantkit.loadtest.lengths import LogNormal
from quantkit.loadtest.ramp import MAX_REQUESTS_PER_STEP, RampPolicy
from quantkit.loadtest.requests import MAX_DRAWS_PER_FIT, LengthModel, RequestStream
from quantkit.loadtest.slo import parse_slo


def _model(max_model_len: int) -> LengthModel:
    # prompts around 200 tokens, replies around 20
    return LengthModel(LogNormal(math.log(200), 0.3), LogNormal(math.log(20), 0.3), max_model_len)


def test_a_context_no_request_fits_ends_the_draw_in_one_line():
    stream = RequestStream([list(range(5000))], _model(8))
    with pytest.raises(QuantkitError, match=r"^--max-model-len: 8 tokens: not one of 1000 requests"):
        stream.take(4)
    assert stream.too_long == MAX_DRAWS_PER_FIT


def test_a_context_some_requests_fit_still_draws():
    stream = RequestStream([list(range(5000))], _model(230))
    got = stream.take(8)
    assert len(got) == 8 and all(r.prompt_tokens + r.output_tokens <= 230 for r in got) and stream.too_long > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(min_requests=10**9), f"--min-requests: 1000000000: at most {MAX_REQUESTS_PER_STEP} a step"),
    (dict(max_seconds=math.nan), "--max-minutes: nan: must be a finite number above 0"),
    (dict(max_seconds=math.inf), "--max-minutes: inf: must be a finite number above 0"),
    (dict(max_concurrency=10**6), "--max-concurrency: 1000000: at most 4096"),
])
def test_a_ramp_without_bounds_is_refused(kwargs, message):
    with pytest.raises(QuantkitError, match=f"^{message}"):
        RampPolicy(**kwargs)


def test_an_slo_bound_must_be_finite():
    with pytest.raises(QuantkitError, match=r"^--slo: ttft must be above 0 and under 86400 s"):
        parse_slo("ttft=" + "9" * 400 + "ms")
    assert parse_slo("e2e=3600s").e2e == 3600.0
