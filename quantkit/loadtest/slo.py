"""The service-level objective a load test counts goodput against: ``--slo ttft=2s,tpot=50ms``.

Only requests that meet every named bound count towards goodput (TTFT: request to first token;
TPOT: mean time per output token after the first; ITL: the largest gap between tokens; E2E: the
whole request). Example: TPOT <= 50 ms is 20 tokens/s a stream."""
from __future__ import annotations

import re
from dataclasses import dataclass

from quantkit.errors import QuantkitError

KEYS = ("ttft", "tpot", "itl", "e2e")
_TERM = re.compile(r"^\s*([a-z0-9]+)\s*=\s*([0-9]*\.?[0-9]+)\s*(ms|s)\s*$")


@dataclass(frozen=True)
class SLO:
    """Upper bounds in seconds; None: not part of the objective."""
    ttft: float | None = None
    tpot: float | None = None
    itl: float | None = None
    e2e: float | None = None

    def met(self, timing: dict) -> bool:
        """Whether one request's timings (seconds, keyed as ``KEYS``; ``itl_max``, the largest gap,
        for the ITL bound where given) meet every bound.

        >>> SLO(itl=0.1).met({"itl": 0.05, "itl_max": 0.3}), SLO(itl=0.1).met({"itl": 0.05})
        (False, True)
        """
        def value(k: str):   # the ITL bound holds for every gap: the largest one is checked
            return timing.get("itl_max", timing.get("itl")) if k == "itl" else timing.get(k)
        return all(getattr(self, k) is None or (value(k) is not None and value(k) <= getattr(self, k)) for k in KEYS)

    def to_dict(self) -> dict:
        return {f"{k}_ms": getattr(self, k) * 1000 for k in KEYS if getattr(self, k) is not None}


MAX_BOUND_S = 24 * 3600.0   # a latency bound of a day or more bounds nothing (and 1e400 is infinite)


def parse_slo(text: str, flag: str = "--slo") -> SLO:
    """``"ttft=2s,tpot=50ms"`` -> ``SLO(ttft=2.0, tpot=0.05)``.

    >>> parse_slo("ttft=2s, tpot=50ms")
    SLO(ttft=2.0, tpot=0.05, itl=None, e2e=None)
    >>> parse_slo("tpot=fast")
    Traceback (most recent call last):
    quantkit.errors.QuantkitError: --slo: 'tpot=fast': expected NAME=NUMBER(ms|s), e.g. ttft=2s,tpot=50ms
    """
    bounds: dict[str, float] = {}
    for term in (t for t in (text or "").split(",") if t.strip()):
        m = _TERM.match(term.lower())
        if not m:
            raise QuantkitError(f"{flag}: {term.strip()!r}: expected NAME=NUMBER(ms|s), e.g. ttft=2s,tpot=50ms")
        key, value, unit = m.groups()
        if key not in KEYS:
            raise QuantkitError(f"{flag}: {key!r}: expected one of {', '.join(KEYS)}")
        if key in bounds:
            raise QuantkitError(f"{flag}: {key} given twice")
        seconds = float(value) / (1000 if unit == "ms" else 1)
        if not 0 < seconds < MAX_BOUND_S:
            raise QuantkitError(f"{flag}: {key} must be above 0 and under {MAX_BOUND_S:g} s, got {value[:20]}{unit}")
        bounds[key] = seconds
    if not bounds:
        raise QuantkitError(f"{flag}: empty: name at least one bound, e.g. ttft=2s,tpot=50ms")
    return SLO(**bounds)
