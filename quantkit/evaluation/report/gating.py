"""The gating figures both reports show, read from report.json's dict: each figure with its limits and margin, and each reason's margin, interval and sign."""

from __future__ import annotations
import math
from dataclasses import dataclass
from quantkit.evaluation.report.content import short
from quantkit.evaluation.measures import MEASURES, NOGO, Limit
from quantkit.evaluation.verdict import EVIDENCE, judged_level, passing_end
from quantkit.evaluation.report.words import MEANING_ZH


@dataclass(frozen=True)
class Gated:
    """One gated figure of one slice beside the limit it is judged by: the NO-GO limit when it is
    past it, else the REVIEW limit. ``margin`` > 0: inside the limit by that much; < 0: past it.
    A measure over a few prompts is judged on its ``interval`` (the end nearest to passing), and its
    margin is that end's."""
    slice: str
    measure: str
    value: float
    limit: float
    level: str
    higher_is_better: bool
    interval: tuple[float, float] | None = None

    @property
    def judged(self) -> float:
        return self.value if self.interval is None else passing_end(self.interval, self.higher_is_better)

    @property
    def margin(self) -> float:
        return self.judged - self.limit if self.higher_is_better else self.limit - self.judged

    @property
    def sign(self) -> str:
        inside = self.margin >= 0
        return ("≥" if inside else "<") if self.higher_is_better else ("≤" if inside else ">")

    @property
    def relative_margin(self) -> float:
        return self.margin / abs(self.limit) if self.limit else self.margin


def limits_of(data: dict, name: str) -> dict[str, Limit]:
    """The limits that judge slice ``name``: report.json's thresholds with the slice's overrides."""
    t = data["thresholds"]
    out = {}
    for m, lim in t.items():
        if m == "slices":
            continue
        own = (t.get("slices") or {}).get(name, {}).get(m, {})
        out[m] = Limit(own.get("review", lim["review"]), own.get("nogo", lim["nogo"]), lim["higher_is_better"])
    return out


def gated_figures(data: dict) -> list[Gated]:
    """Every figure of a gated slice that has a limit, in slice then threshold order."""
    out = []
    off = data["verdict"].get("not_gated", {})
    for name, values in data["slices"].items():
        if name in off:
            continue
        for m, lim in limits_of(data, name).items():
            v = values.get(m)
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                continue
            level, interval = judged_level(m, lim, values)
            limit = lim.nogo if level == NOGO else lim.review
            out.append(Gated(name, m, v, limit, level, lim.higher_is_better, interval))
    return out


def headline_figures(figures: list[Gated]) -> list[Gated]:
    """Each slice's figure closest to its limit (or furthest past it), tightest first."""
    closest: dict[str, Gated] = {}
    for f in figures:
        if f.slice not in closest or f.relative_margin < closest[f.slice].relative_margin:
            closest[f.slice] = f
    return sorted(closest.values(), key=lambda f: f.relative_margin)


def margin_text(margin: float, words, show=short) -> str:
    return words("margin", m=show(margin)) if margin >= 0 else words("over_by", m=show(-margin))


def _higher_is_better(measure: str) -> bool:
    # a slice short of evidence: its scored tokens fall below the minimum
    return MEASURES[measure].higher_is_better if measure in MEASURES else measure == EVIDENCE


def reason_margin(r: dict) -> float:
    """A verdict reason's margin (negative: every reason is past its limit)."""
    return r["value"] - r["limit"] if _higher_is_better(r["measure"]) else r["limit"] - r["value"]


def _severity(r: dict) -> tuple[int, float]:
    """How bad a reason is, for sorting: NO-GO before REVIEW, then how far past its limit,
    relative to the limit."""
    margin = reason_margin(r)
    return (0 if r["level"] == NOGO else 1, margin / abs(r["limit"]) if r["limit"] else margin)


def worst_per_slice(reasons: list[dict]) -> list[list[int]]:
    """The indexes of ``reasons`` grouped by slice, each group worst first, the worst groups first.

    >>> rs = [{"slice": "a", "measure": "kl_mean", "value": 0.2, "limit": 0.1, "level": "NO-GO"},
    ...       {"slice": "b", "measure": "kl_mean", "value": 0.07, "limit": 0.06, "level": "REVIEW"},
    ...       {"slice": "a", "measure": "kl_mean", "value": 0.5, "limit": 0.1, "level": "NO-GO"}]
    >>> worst_per_slice(rs)
    [[2, 0], [1]]
    """
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(reasons):
        groups.setdefault(r["slice"], []).append(i)
    ordered = [sorted(g, key=lambda i: _severity(reasons[i])) for g in groups.values()]
    return sorted(ordered, key=lambda g: _severity(reasons[g[0]]))


def reason_interval(r: dict, words, show=short) -> str:
    """The interval over prompts a reason was gated on, as an aside ("" for one gated on its value)."""
    if not r.get("interval"):
        return ""
    lo, hi = r["interval"]
    return words("interval_prompts", lo=show(lo), hi=show(hi))


def reason_sign(r: dict) -> str:
    return "<" if _higher_is_better(r["measure"]) else ">"


def meaning(measure: str, lang: str) -> str:
    text = MEASURES[measure].meaning if measure in MEASURES else ""
    return MEANING_ZH.get(text, text) if lang == "zh" else text
