"""The measure contract: one ``Measure`` record per gated figure, in a registry that the
verdict, the bootstrap and the reports read.

A measure is a number computed from what a scoring backend returned for one slice
(``backends.base.ScoredSlice``), with a direction, default REVIEW / NO-GO limits and the
measurement those limits came from. A new measure is one module that calls the decorator::

    @measure(name="nll_gap", higher_is_better=False, review=0.05, nogo=0.2,
             evidence="...", applies=lambda s: s.forced is not None)
    def nll_gap(s: ScoredSlice) -> float | None:
        ...

and is imported from ``measures/__init__.py``. The registry's order is the order of the
thresholds in report.json and the reports.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from quantkit.evaluation.backends.base import ScoredSlice

if TYPE_CHECKING:
    from quantkit.evaluation.forced import ForcedResult, ItemStats

GO, REVIEW, NOGO = "GO", "REVIEW", "NO-GO"
RANK = {GO: 0, REVIEW: 1, NOGO: 2}


@dataclass(frozen=True)
class Limit:
    review: float
    nogo: float | None
    higher_is_better: bool

    def level(self, value: float) -> str:
        worse = (lambda a, b: a < b) if self.higher_is_better else (lambda a, b: a > b)
        if self.nogo is not None and worse(value, self.nogo):
            return NOGO
        if worse(value, self.review):
            return REVIEW
        return GO


def _always(_: ScoredSlice) -> bool:
    return True


@dataclass(frozen=True)
class Measure:
    """One gated measure.

    ``compute`` is called on a slice only when ``applies`` says the slice holds what it needs
    (a slice without texts has no ``kl_mean``); what it returns, None included, is recorded.
    ``table`` are the figures the slice table shows for it (default: the measure itself),
    placed by ``table_rank``. ``row_value`` (per scored row, summed, over the row's scored
    tokens) makes the bootstrap give it an interval over rows (``<name>_ci``), mapped through
    ``from_ratio``. ``per_prompt`` (each prompt's value, of which the measure is the mean) marks a
    measure over a few prompts: the bootstrap gives it an interval over prompts and the verdict
    counts its breach only when the whole interval is past the limit (verdict.py). Measures the
    evaluation does not compute itself (lm-eval, the integrity pass) have no ``compute``: their
    values arrive as pseudo-slices."""
    name: str
    higher_is_better: bool
    review: float
    nogo: float | None
    evidence: str                                  # the measurement the default limits came from
    compute: Callable[[ScoredSlice], float | None] | None = None
    applies: Callable[[ScoredSlice], bool] = _always
    title: str = ""                                # the report's column title (default: the name)
    fmt: str = ".6g"
    table: tuple[str, ...] | None = None
    table_rank: int = 100                          # the shipped measures' columns come first
    row_value: Callable[[ItemStats], float] | None = None
    from_ratio: Callable[[float], float] | None = None
    per_prompt: Callable[[ScoredSlice], list[float]] | None = None
    meaning: str = ""                              # what a breach says, beside the figure and its limit

    @property
    def limit(self) -> Limit:
        return Limit(self.review, self.nogo, self.higher_is_better)

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.name,) if self.table is None else self.table


MEASURES: dict[str, Measure] = {}


def register(m: Measure) -> Measure:
    if m.name in MEASURES:
        raise ValueError(f"measure {m.name!r} is already registered")
    MEASURES[m.name] = m
    return m


def measure(**fields) -> Callable[[Callable], Callable]:
    """Register the decorated function as the ``compute`` of a ``Measure(**fields)``."""
    def add(compute: Callable) -> Callable:
        register(Measure(compute=compute, **fields))
        return compute
    return add


def measure_values(scored: ScoredSlice) -> dict[str, float | None]:
    """Every registered measure that applies to ``scored``, in registry order."""
    return {m.name: m.compute(scored) for m in MEASURES.values()
            if m.compute is not None and m.applies(scored)}


def forced_summary(forced: ForcedResult) -> dict[str, float | None]:
    """A teacher-forced pass's ``figures()`` and every registered measure of its texts."""
    return {**forced.figures(), **measure_values(ScoredSlice(forced=forced))}


def table_columns() -> list[tuple[str, str, str]]:
    """(key, title, format) of the slice table's columns, in order."""
    out = []
    for m in sorted(MEASURES.values(), key=lambda m: m.table_rank):   # stable: ties keep registry order
        out += [(c, (m.title or c) if c == m.name else c, m.fmt if c == m.name else ".6g") for c in m.columns]
    return out
