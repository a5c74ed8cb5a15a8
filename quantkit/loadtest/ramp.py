"""A ramp's steps summarised, its knee found, and the concurrency to run at.

A step is one concurrency level held until enough requests completed. Its summary: requests/s,
output tokens/s, TTFT / TPOT / ITL / end-to-end latency at P50, P90 and P99 over its requests,
goodput (requests/s that met the SLO: only throughput within the objective counts), errors. A
request's ITL is its largest gap between tokens (``itl_max`` where the generator gives it: a
stream stalled by another request's prefill shows there; its mean gap is its TPOT).

The knee, by rule: the first step whose output throughput grew by less than ``FLAT`` over the
step before while its latency grew fast: TPOT P50 by more than ``TPOT_GROWTH`` (the batch slows
every stream), or TTFT P50 by more than ``TTFT_GROWTH`` (requests queue for a slot: a server
capped by ``max_num_seqs`` keeps its TPOT and makes new requests wait), or whose throughput fell;
the knee is the step before it, where throughput stopped paying for latency. Production runs at
``SHARE`` of it, rounded down, at least 1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

from quantkit.errors import QuantkitError
from quantkit.loadtest.lengths import percentile
from quantkit.loadtest.slo import KEYS, SLO

# bounds on what a ramp is asked, so that every step is built and sent within memory and time
MAX_CONCURRENCY = 4096
MAX_REQUESTS_PER_STEP = 10_000
FLAT = 0.10           # output throughput gained by the next step, below which it has flattened
TPOT_GROWTH = 0.25    # TPOT P50 grown by the next step, above which latency pays for it
TTFT_GROWTH = 1.0     # TTFT P50 grown by the next step (doubled), above which requests queue
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
        values = [t.get("itl_max", t.get("itl")) if key == "itl" else t.get(key) for t in ok]
        out[f"{key}_ms"] = _percentiles([v for v in values if v is not None])
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
        slower = _grew(prev, step, "tpot_ms", TPOT_GROWTH) or _grew(prev, step, "ttft_ms", TTFT_GROWTH)
        if gain < 0 or (gain < FLAT and slower):
            return prev["concurrency"]
    return None


def _grew(prev: dict, step: dict, key: str, share: float) -> bool:
    p0, p1 = (prev.get(key) or {}).get("p50"), (step.get(key) or {}).get("p50")
    return p0 is not None and p1 is not None and p1 > p0 * (1 + share)


def recommended(knee: int) -> int:
    """The concurrency to run production at: ``SHARE`` of the knee.

    >>> recommended(16), recommended(1)
    (11, 1)
    """
    return max(1, math.floor(SHARE * knee))


@dataclass(frozen=True)
class RampPolicy:
    """How the ramp climbs and when it stops.

    Concurrency starts at ``start`` and doubles up to ``max_concurrency``. A step sends a
    warm-up wave (one request per slot, not counted: every slot starts at once) and then at least
    ``min_requests`` and ``per_slot`` requests a slot more, the ones its figures come from. The ramp
    stops once the knee is passed, once the SLO is broken at P99 for ``slo_break_steps`` steps in a
    row, once a step's errors pass ``error_share`` of its requests, at ``max_concurrency``, or when
    ``max_seconds`` are spent.
    """
    start: int = 1
    max_concurrency: int = 256
    min_requests: int = 16
    per_slot: int = 2
    slo_break_steps: int = 2
    error_share: float = 0.05
    max_seconds: float = 30 * 60.0

    def __post_init__(self) -> None:
        if self.start < 1 or self.max_concurrency < self.start:
            raise QuantkitError(f"--max-concurrency: {self.max_concurrency}: must be at least the first step "
                                f"({self.start})")
        if self.min_requests < 1 or self.per_slot < 1:
            raise QuantkitError("--min-requests: must be at least 1")
        if self.min_requests > MAX_REQUESTS_PER_STEP:
            raise QuantkitError(f"--min-requests: {self.min_requests}: at most {MAX_REQUESTS_PER_STEP} a step")
        if self.max_concurrency > MAX_CONCURRENCY:
            raise QuantkitError(f"--max-concurrency: {self.max_concurrency}: at most {MAX_CONCURRENCY}")
        if not math.isfinite(self.max_seconds) or self.max_seconds <= 0:
            raise QuantkitError(f"--max-minutes: {self.max_seconds / 60:g}: must be a finite number above 0")

    def concurrencies(self) -> Iterator[int]:
        """1, 2, 4, ... up to ``max_concurrency`` (which is the last step even when not a power of two).

        >>> list(RampPolicy(max_concurrency=12).concurrencies())
        [1, 2, 4, 8, 12]
        """
        c = self.start
        while c < self.max_concurrency:
            yield c
            c *= 2
        yield self.max_concurrency

    def measured(self, concurrency: int) -> int:
        """The requests a step's figures come from.

        >>> RampPolicy().measured(1), RampPolicy().measured(32)
        (16, 64)
        """
        return max(self.min_requests, self.per_slot * concurrency)


def slo_broken_p99(step: dict, slo: SLO) -> list[str]:
    """The SLO's bounds this step breaks at P99 (``ttft``, ``tpot``, ...).

    >>> slo_broken_p99({"ttft_ms": {"p99": 2500.0}, "tpot_ms": {"p99": 40.0}}, SLO(ttft=2.0, tpot=0.05))
    ['ttft']
    """
    out = []
    for key in KEYS:
        bound, p = getattr(slo, key), (step.get(f"{key}_ms") or {}).get("p99")
        if bound is not None and p is not None and p > bound * 1000:
            out.append(key)
    return out


def stop_reason(steps: list[dict], policy: RampPolicy, slo: SLO) -> str | None:
    """Why the ramp stops after ``steps`` (None: climb on). The time limit is the caller's."""
    last = steps[-1]
    sent = last["requests"] + last["errors"]
    if sent and last["errors"] > policy.error_share * sent:
        return f"errors: {last['errors']} of {sent} requests failed at concurrency {last['concurrency']}"
    knee = find_knee(steps)
    if knee is not None:
        return f"passed the knee at concurrency {knee}"
    tail = steps[-policy.slo_break_steps:]
    if len(tail) == policy.slo_break_steps and all(slo_broken_p99(s, slo) for s in tail):
        return f"the SLO broken at P99 for {policy.slo_break_steps} steps ({', '.join(slo_broken_p99(last, slo))})"
    if last["concurrency"] >= policy.max_concurrency:
        return f"reached --max-concurrency {policy.max_concurrency}"
    return None
