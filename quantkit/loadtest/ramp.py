"""A ramp's steps summarised, its knee found, and the concurrency to run at.

A step is one concurrency level held until enough requests completed. Its summary: requests/s,
output tokens/s, TTFT / TPOT / ITL / end-to-end latency at P50, P90 and P99, goodput (requests/s
that met the SLO: only throughput within the objective counts), errors.

The knee, by rule: the first step whose output throughput grew by less than ``FLAT`` over the
step before while its TPOT P50 grew by more than ``TPOT_GROWTH`` (or whose throughput fell);
the knee is the step before it, where throughput stopped paying for latency. Production runs at
``SHARE`` of it, rounded down, at least 1.
"""
from __future__ import annotations

import math

from quantkit.loadtest.lengths import percentile
from quantkit.loadtest.slo import SLO

FLAT = 0.10           # output throughput gained by the next step, below which it has flattened
TPOT_GROWTH = 0.25    # TPOT P50 grown by the next step, above which latency pays for it
SHARE = 0.7           # of the knee, the concurrency recommended for production
LATENCIES = ("ttft", "tpot", "itl", "e2e")


def _percentiles(values: list[float]) -> dict | None:
    if not values:
        return None
    return {f"p{q}": percentile(values, q / 100) * 1000 for q in (50, 90, 99)}


def step_summary(concurrency: int, timings: list[dict], seconds: float, slo: SLO) -> dict:
    """One step from its requests' timings (seconds; ``ok``, ``output_tokens`` and the
    ``LATENCIES`` keys) over ``seconds`` of wall time."""
    ok = [t for t in timings if t.get("ok")]
    out = {"concurrency": concurrency, "requests": len(ok), "errors": len(timings) - len(ok), "seconds": seconds,
           "requests_per_s": len(ok) / seconds if seconds > 0 else 0.0,
           "output_tokens_per_s": sum(t["output_tokens"] for t in ok) / seconds if seconds > 0 else 0.0,
           "goodput_rps": sum(slo.met(t) for t in ok) / seconds if seconds > 0 else 0.0}
    for key in LATENCIES:
        out[f"{key}_ms"] = _percentiles([t[key] for t in ok if t.get(key) is not None])
    return out


def find_knee(steps: list[dict]) -> int | None:
    """The concurrency of the knee (see the module docstring); None while throughput still pays.

    >>> s = lambda c, tps, tpot: {"concurrency": c, "output_tokens_per_s": tps, "tpot_ms": {"p50": tpot}}
    >>> find_knee([s(1, 20, 50), s(2, 39, 51), s(4, 75, 53), s(8, 80, 99)])
    4
    >>> find_knee([s(1, 20, 50), s(2, 39, 51)]) is None
    True
    """
    for prev, step in zip(steps, steps[1:]):
        gain = step["output_tokens_per_s"] / prev["output_tokens_per_s"] - 1 if prev["output_tokens_per_s"] else 0
        p0, p1 = (prev.get("tpot_ms") or {}).get("p50"), (step.get("tpot_ms") or {}).get("p50")
        slower = p0 is not None and p1 is not None and p1 > p0 * (1 + TPOT_GROWTH)
        if gain < 0 or (gain < FLAT and slower):
            return prev["concurrency"]
    return None


def recommended(knee: int) -> int:
    """The concurrency to run production at: ``SHARE`` of the knee.

    >>> recommended(16), recommended(1)
    (11, 1)
    """
    return max(1, math.floor(SHARE * knee))
