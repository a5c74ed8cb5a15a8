"""How many samples each (task type x length bucket) cell gets. Pure arithmetic, no data.

A cell has two sizes: its traffic (rows of the log, repeats counted) and its distinct rows (what
can be drawn: de-duplication means no text is drawn twice). The policy weighs cells by traffic;
the distinct rows only cap what a cell can give.

1. Floors: every non-empty cell gets ``min(min_per_cell, capacity)``. When ``n`` is too small
   to floor every cell, the floors go to the cells with the most traffic first (ties by key).
2. The rest is water-filled: each cell gets ``clip(lam * weight, floor, capacity)`` with one
   ``lam`` chosen so the total is ``n``. The weight is the cell's traffic under ``traffic``
   (shares follow the requests the server sees), its square root under ``sqrt`` (a compromise
   that lifts rare cells), and 1 under ``balanced`` (equal cells). A cell whose distinct rows
   run out before its share gives the remainder to the others, by the same weights.
3. Integers by largest remainder, ties broken by cell key, never above capacity.
"""

from __future__ import annotations

import math
from typing import Hashable, Mapping, TypeVar

K = TypeVar("K", bound=Hashable)

_BISECTION_STEPS = 100


POLICIES = ("traffic", "sqrt", "balanced")


def policy_weight(policy: str, traffic: float) -> float:
    """A cell's weight under ``policy`` from its traffic (rows, repeats counted)."""
    if policy == "traffic":
        return float(traffic)
    if policy == "sqrt":
        return math.sqrt(traffic)
    if policy == "balanced":
        return 1.0
    raise ValueError(f"unknown allocation policy {policy!r} (known: {', '.join(POLICIES)})")


def allocate(traffic: Mapping[K, int], n: int, policy: str = "traffic", min_per_cell: int = 1,
             capacity: Mapping[K, int] | None = None) -> dict[K, int]:
    """Samples per cell: ``traffic`` counts each cell's rows with repeats, ``capacity`` its
    distinct rows (default: ``traffic``, a log without repeats).

    Example:
        >>> allocate({"a": 900, "b": 90, "c": 10}, 100, min_per_cell=2)
        {'a': 89, 'b': 9, 'c': 2}
        >>> allocate({"a": 900, "b": 90, "c": 10}, 100, "sqrt", 2)
        {'a': 70, 'b': 22, 'c': 8}
    """
    cap = {c: int((capacity or traffic)[c]) for c in traffic if traffic[c] > 0}
    cells = sorted(cap, key=_key)
    if n >= sum(cap.values()):
        return {c: cap[c] for c in cells}
    floors = _floors(traffic, cap, cells, n, min_per_cell)
    weights = {c: policy_weight(policy, traffic[c]) for c in cells}
    ideal = _water_fill(weights, floors, cap, n)
    return _round(ideal, floors, cap, cells, n)


def _key(cell: object) -> tuple:
    return tuple(map(str, cell)) if isinstance(cell, tuple) else (str(cell),)


def _floors(counts: Mapping[K, int], cap: dict[K, int], cells: list[K], n: int,
            min_per_cell: int) -> dict[K, int]:
    by_size = sorted(cells, key=lambda c: (-counts[c], _key(c)))
    floors = {c: 0 for c in cells}
    budget = n
    for level in range(1, min_per_cell + 1):
        for c in by_size:
            if budget == 0:
                return floors
            if floors[c] < min(level, cap[c]):
                floors[c] += 1
                budget -= 1
    return floors


def _water_fill(weights: dict[K, float], floors: dict[K, int], cap: dict[K, int],
                n: int) -> dict[K, float]:
    def total(lam: float) -> float:
        return sum(min(max(lam * w, floors[c]), cap[c]) for c, w in weights.items())

    lo, hi = 0.0, max(cap[c] / w for c, w in weights.items() if w > 0)
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) < n else (lo, mid)
    return {c: min(max(hi * w, floors[c]), cap[c]) for c, w in weights.items()}


def _round(ideal: dict[K, float], floors: dict[K, int], cap: dict[K, int], cells: list[K],
           n: int) -> dict[K, int]:
    out = {c: max(floors[c], min(cap[c], math.floor(ideal[c] + 1e-9))) for c in cells}
    left = n - sum(out.values())
    order = sorted(cells, key=lambda c: (-(ideal[c] - out[c]), _key(c)))
    while left > 0:
        progressed = False
        for c in order:
            if left == 0:
                break
            if out[c] < cap[c]:
                out[c] += 1
                left -= 1
                progressed = True
        if not progressed:
            break
    while left < 0:  # float slack can overshoot by a unit: take it back from the largest excess
        c = max((c for c in cells if out[c] > floors[c]), key=lambda c: (out[c] - ideal[c], _key(c)))
        out[c] -= 1
        left += 1
    return out
