"""The latency objective and a ramp's summary: goodput counts only requests within the SLO, and
the knee is where throughput stops paying for latency."""
from __future__ import annotations

import pytest

from quantkit.errors import QuantkitError
from quantkit.loadtest.ramp import find_knee, recommended, step_summary
from quantkit.loadtest.slo import SLO, parse_slo


@pytest.mark.parametrize("text, message", [
    ("", "--slo: empty"), ("ttft=2", "expected NAME=NUMBER"), ("speed=2s", "'speed': expected one of"),
    ("tpot=50ms,tpot=60ms", "tpot given twice"), ("ttft=0s", "ttft must be above 0"),
])
def test_an_unparsable_slo_names_the_flag(text, message):
    with pytest.raises(QuantkitError, match=message):
        parse_slo(text)


def test_goodput_counts_only_requests_within_every_bound():
    slo = parse_slo("ttft=2s,tpot=50ms")
    assert slo == SLO(ttft=2.0, tpot=0.05) and slo.to_dict() == {"ttft_ms": 2000.0, "tpot_ms": 50.0}
    fast = {"ok": True, "output_tokens": 100, "ttft": 0.5, "tpot": 0.04, "itl": 0.06, "e2e": 4.5}
    slow_first = {**fast, "ttft": 2.5}
    slow_stream = {**fast, "tpot": 0.051}
    failed = {"ok": False}
    s = step_summary(4, [fast, fast, slow_first, slow_stream, failed], seconds=10.0, slo=slo)
    assert (s["requests"], s["errors"]) == (4, 1)
    assert s["requests_per_s"] == pytest.approx(0.4) and s["goodput_rps"] == pytest.approx(0.2)
    assert s["output_tokens_per_s"] == pytest.approx(40.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(500.0) and s["ttft_ms"]["p99"] > 2000
    assert s["tpot_ms"]["p90"] == pytest.approx(47.7, abs=0.01)   # 0.04 x3, 0.051: interpolated


def _step(c, tps, tpot):
    return {"concurrency": c, "output_tokens_per_s": tps, "tpot_ms": {"p50": tpot}}


def test_the_knee_is_where_throughput_flattens_as_latency_grows():
    # a server that scales to 8 streams: throughput doubles with each step until then, TPOT barely moves
    ramp = [_step(1, 20, 50), _step(2, 39, 51), _step(4, 76, 52), _step(8, 148, 54), _step(16, 155, 103)]
    assert find_knee(ramp) == 8 and recommended(8) == 5
    assert find_knee(ramp[:4]) is None   # still paying: no knee yet
    assert find_knee([_step(1, 20, 50), _step(2, 18, 60)]) == 1   # throughput fell
    # flat throughput at flat latency (a client-side limit, say) is not a knee of the server
    assert find_knee([_step(1, 20, 50), _step(2, 21, 50), _step(4, 40, 51)]) is None
