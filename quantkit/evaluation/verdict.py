"""GO / REVIEW / NO-GO from per-slice measures and thresholds.

Each measure has a REVIEW limit and (for most) a NO-GO limit. A slice is as bad as its
worst measure; the run is as bad as its worst gated slice. Every breached limit becomes a
reason naming the slice, the measure, the value and the limit. Slices in languages the
model is not for (languages.py: ``--languages`` / ``eval: languages:``, else the model
card) are measured and get their level, but their breaches are information only and
never change the decision.

The measures, their direction, default limits and the measurements those limits came
from are the registered ``Measure`` records (measures/: one module per family; KL in nats,
fractions otherwise, "drop" = baseline minus candidate). The defaults were derived from the
full default suite on SmolLM2-135M-Instruct (benchmarks/RESULTS.md, the evaluation suite),
RTN checkpoints, on the gated (English) slices: W8A16 and FP8_DYNAMIC are GO on English and
W4A16 RTN is NO-GO on every English text slice. The REVIEW limits sit 1.25-1.5x above
FP8_DYNAMIC's worst English error (a candidate a little worse than FP8 still passes; one
clearly worse is reviewed), not more. On Chinese text this English-only model breaks more
easily (FP8_DYNAMIC: numbers-zh KL 0.081, greedy agreement 0.05): those slices are measured
and shown but gate only when asked (languages.py).

A measure over a few prompts (greedy agreement over 8 prompts, extraction F1 over 12: a
``Measure`` with ``per_prompt``) gates on its 95% interval over prompts (``<measure>_ci``,
bootstrap.py): its breach counts only when the whole interval is past the limit. Over 8 prompts
greedy agreement moves by about 0.1 with other prompts, or with another path's kernels for the
same checkpoint (FP8_DYNAMIC on names-en: 0.32 in quantkit's path, 0.23 in vLLM's), and a
decision that follows the point value flips with it. Without an interval the value decides.

Long-context slices are gated on their deepest position bucket too (``kl_last_bucket``; the
buckets are powers of two up to the deployment length, so at 8192 it is positions 4096-8191):
KV-cache error grows with the context a token is predicted from, and a slice's mean, most of
it from shallower positions, can hide it (tests/evaluation/test_kv_faults.py: a mean of 0.05
over a last bucket of 0.12).

The checkpoint's integrity (``integrity/``: every quantized module decoded from the
candidate's files and compared with the baseline) adds one pseudo-slice per flagged module or
tensor, ``integrity:<name>``, which always gates (measures/external.py: ``recon_excess_db``,
``recon_unit_excess_db``, ``recon_gain_error``, ``tensor_problems``, ``tensor_rel_error``).
REVIEW at 0 dB means "worse than the worst clean part measured, with a 3 dB margin" for GPTQ.

A business slice (the user's own log, business.py) holding fewer scored tokens than its budget
(``SuiteOptions.business_scored_tokens``, 1024 by default) is insufficient evidence: its KL and
agreement rest on too few tokens to tell a fault from the rows drawn. It cannot decide the
verdict by itself, in either direction: it counts as REVIEW, whatever its measures say, with the
reason "insufficient evidence: N scored tokens < 1024" beside any limit it breached (a NO-GO
breach on it is shown, and makes REVIEW, not NO-GO). Other slices decide as before.

Override from a recipe's ``eval:`` section (or ``thresholds=``)::

    thresholds:
      kl_mean: {review: 0.01, nogo: 0.05}
      slices:
        long-en: {kl_worst_bucket: {review: 0.08}}
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator, Mapping

from quantkit.errors import QuantkitError
from quantkit.evaluation.measures import GO, MEASURES, NOGO, RANK, REVIEW, Limit

EVIDENCE = "scored_tokens"      # the reason of a slice with too little evidence (insufficient)


class _RegisteredLimits(Mapping[str, Limit]):
    """The default limit of every registered measure, read at each access: a measure registered
    after import is in it."""

    def __getitem__(self, name: str) -> Limit:
        return MEASURES[name].limit

    def __iter__(self) -> Iterator[str]:
        return iter(MEASURES)

    def __len__(self) -> int:
        return len(MEASURES)


DEFAULT_LIMITS: Mapping[str, Limit] = _RegisteredLimits()


@dataclass
class Thresholds:
    limits: dict[str, Limit] = field(default_factory=lambda: dict(DEFAULT_LIMITS))
    per_slice: dict[str, dict[str, Limit]] = field(default_factory=dict)

    def for_slice(self, name: str) -> dict[str, Limit]:
        return {**self.limits, **self.per_slice.get(name, {})}

    @classmethod
    def from_dict(cls, d: dict | None, where: str = "eval.thresholds") -> "Thresholds":
        """Defaults overridden by a dict (a recipe's ``eval: thresholds:``)."""
        t = cls()
        if not d:
            return t
        if not isinstance(d, dict):
            raise QuantkitError(f"{where}: expected a mapping of measure -> {{review, nogo}}")
        for key, value in d.items():
            if key == "slices":
                if not isinstance(value, dict):
                    raise QuantkitError(f"{where}.slices: expected a mapping of slice -> measures")
                for sname, measures in value.items():
                    base = t.for_slice(sname)
                    t.per_slice[sname] = {m: _override(base, m, v, f"{where}.slices.{sname}.{m}")
                                          for m, v in (measures or {}).items()}
            else:
                t.limits[key] = _override(t.limits, key, value, f"{where}.{key}")
        return t

    def to_dict(self) -> dict:
        out = {m: {"review": l.review, "nogo": l.nogo, "higher_is_better": l.higher_is_better}
               for m, l in self.limits.items()}
        if self.per_slice:
            out["slices"] = {s: {m: {"review": l.review, "nogo": l.nogo} for m, l in ms.items()}
                             for s, ms in self.per_slice.items()}
        return out


def _override(limits: dict[str, Limit], measure: str, value, where: str) -> Limit:
    if measure not in limits:
        raise QuantkitError(f"{where}: unknown measure (known: {', '.join(sorted(DEFAULT_LIMITS))})")
    if not isinstance(value, dict) or set(value) - {"review", "nogo"}:
        raise QuantkitError(f"{where}: expected {{review: <number>, nogo: <number or null>}}")
    for k, v in value.items():
        if v is not None and not isinstance(v, (int, float)):
            raise QuantkitError(f"{where}.{k}: expected a number, got {v!r}")
    if value.get("review", 0) is None:
        raise QuantkitError(f"{where}.review: cannot be null")
    return replace(limits[measure], **value)


@dataclass(frozen=True)
class Reason:
    slice: str
    measure: str
    value: float
    limit: float
    level: str
    interval: tuple[float, float] | None = None    # over prompts, for a measure gated on its interval

    def text(self) -> str:
        if self.measure == EVIDENCE:
            return (f"{self.slice}: insufficient evidence: {self.value:.0f} scored tokens < {self.limit:.0f}: "
                    "its measures alone cannot make the verdict GO or NO-GO")
        op = "<" if DEFAULT_LIMITS[self.measure].higher_is_better else ">"
        meaning = MEASURES[self.measure].meaning if self.measure in MEASURES else ""
        over = "" if self.interval is None else (f" (95% interval over prompts {self.interval[0]:.4g}-"
                                                 f"{self.interval[1]:.4g}, all of it {op} {self.limit:.4g})")
        return (f"{self.slice}: {self.measure} {self.value:.4g} {op} {self.limit:.4g}{over}"
                + (f": {meaning}" if meaning else ""))


@dataclass
class Verdict:
    decision: str
    reasons: list[Reason]          # breaches on gated slices: these make the decision
    slices: dict[str, str]         # slice -> its own level (the would-be level when not gated)
    informational: list[Reason] = field(default_factory=list)  # breaches on slices that do not gate
    not_gated: dict[str, str] = field(default_factory=dict)    # slice -> why it does not gate
    # measures whose bootstrap interval over rows holds a limit (within_noise): information
    noise: list[dict] = field(default_factory=list)
    # slices with too little evidence (insufficient): slice -> scored tokens, minimum, measured level
    evidence: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"decision": self.decision, "slices": self.slices,
                "reasons": [_reason_dict(r) for r in self.reasons],
                "informational": [{**_reason_dict(r), "note": self.not_gated[r.slice]}
                                  for r in self.informational],
                "not_gated": self.not_gated, "within_noise": self.noise, "insufficient_evidence": self.evidence}


def _reason_dict(r: Reason) -> dict:
    return {"slice": r.slice, "measure": r.measure, "value": r.value, "limit": r.limit,
            "level": r.level, "text": r.text(), **({"interval": list(r.interval)} if r.interval else {})}


def within_noise(measures: dict[str, dict], thresholds: Thresholds | None = None) -> list[dict]:
    """The measures whose interval (``<measure>_ci``, bootstrap.py) holds one of their limits: with
    other rows of the same traffic, or other prompts, the slice's level could differ. Information
    for the reader: over rows the decision stays the measured value's; a measure over a few prompts
    (``over: prompts``) is gated on its interval, so such a limit did not count (``decide``).

    >>> within_noise({"business:faq": {"kl_mean": 0.055, "kl_mean_ci": [0.04, 0.07]}})
    [{'slice': 'business:faq', 'measure': 'kl_mean', 'value': 0.055, 'interval': [0.04, 0.07], 'limit': 0.06, 'limit_level': 'REVIEW', 'over': 'rows'}]
    """
    thresholds = thresholds or Thresholds()
    out = []
    for sname, values in measures.items():
        for m, lim in thresholds.for_slice(sname).items():
            ci, v = values.get(f"{m}_ci"), values.get(m)
            if not ci or v is None:
                continue
            for level, limit in ((REVIEW, lim.review), (NOGO, lim.nogo)):
                if limit is not None and ci[0] <= limit <= ci[1]:
                    out.append({"slice": sname, "measure": m, "value": v, "interval": list(ci), "limit": limit,
                                "limit_level": level,
                                "over": "prompts" if _prompt_interval(m, values) else "rows"})
    return out


def noise_text(n: dict) -> str:
    """One line for a ``within_noise`` entry.

    >>> noise_text({'slice': 'business:faq', 'measure': 'kl_mean', 'value': 0.055, 'interval': [0.04, 0.07],
    ...             'limit': 0.06, 'limit_level': 'REVIEW'})
    'business:faq: kl_mean 0.055 (95% interval over rows 0.04-0.07) holds its REVIEW limit 0.06: within noise'
    """
    lo, hi = n["interval"]
    over = n.get("over", "rows")
    return (f"{n['slice']}: {n['measure']} {n['value']:.4g} (95% interval over {over} {lo:.4g}-{hi:.4g}) "
            f"holds its {n['limit_level']} limit {n['limit']:.4g}: within noise"
            + (", not counted" if over == "prompts" else ""))


def judged_level(measure: str, lim: Limit, values: dict) -> tuple[str, tuple[float, float] | None]:
    """A measured slice's level on ``measure`` (its value in ``values``) and the interval over
    prompts it was judged on: a measure over a few prompts is judged on the end of its interval
    nearest to passing, every other measure on its value.

    >>> judged_level("gen_agreement", Limit(0.15, 0.10, True), {"gen_agreement": 0.12, "gen_agreement_ci": [0.06, 0.2]})
    ('GO', (0.06, 0.2))
    """
    interval = _prompt_interval(measure, values)
    if interval is None:
        return lim.level(values[measure]), None
    return lim.level(passing_end(interval, lim.higher_is_better)), interval


def passing_end(interval: tuple[float, float], higher_is_better: bool) -> float:
    """The end of an interval nearest to passing: the figure a measure over a few prompts is judged on."""
    return interval[1] if higher_is_better else interval[0]


def _prompt_interval(measure: str, values: dict) -> tuple[float, float] | None:
    """The interval over prompts a measure over a few prompts is gated on (None: gated on its value)."""
    m = MEASURES.get(measure)
    ci = values.get(f"{measure}_ci")
    return (float(ci[0]), float(ci[1])) if m is not None and m.per_prompt is not None and ci else None


def insufficient(measures: dict[str, dict], slices: list[str], minimum: int) -> dict[str, tuple[int, int]]:
    """Of ``slices`` (the business slices), those scored on fewer than ``minimum`` tokens:
    slice -> (scored tokens, minimum).

    >>> insufficient({"business:sentiment": {"tokens": 160}, "business:faq": {"tokens": 2048}},
    ...              ["business:sentiment", "business:faq"], 1024)
    {'business:sentiment': (160, 1024)}
    """
    return {s: (n, minimum) for s in slices if s in measures
            for n in [int(measures[s].get("tokens") or 0)] if n < minimum}


def decide(measures: dict[str, dict], thresholds: Thresholds | None = None,
           not_gated: dict[str, str] | None = None,
           thin: dict[str, tuple[int, int]] | None = None) -> Verdict:
    """Verdict over ``{slice: {measure: value}}`` (measures without a limit are ignored).

    Slices in ``not_gated`` (slice -> why) get their level and reasons as usual, but the
    reasons go to ``informational`` and never change the decision. Slices in ``thin`` (slice ->
    (scored tokens, minimum): ``insufficient``) are REVIEW, whatever they measured; their
    breaches stay among the reasons, beside the one that says so.

    >>> v = decide({"numbers-en": {"kl_mean": 0.3}, "code-en": {"kl_mean": 0.001}})
    >>> v.decision, v.slices, v.reasons[0].text()
    ('NO-GO', {'numbers-en': 'NO-GO', 'code-en': 'GO'}, 'numbers-en: kl_mean 0.3 > 0.1')
    >>> v = decide({"numbers-zh": {"kl_mean": 0.3}}, not_gated={"numbers-zh": "not gated (--languages: en)"})
    >>> v.decision, v.slices, [r.text() for r in v.informational]
    ('GO', {'numbers-zh': 'NO-GO'}, ['numbers-zh: kl_mean 0.3 > 0.1'])
    >>> v = decide({"business:sentiment": {"kl_mean": 0.3, "tokens": 160}}, thin={"business:sentiment": (160, 1024)})
    >>> v.decision, [r.level for r in v.reasons]
    ('REVIEW', ['NO-GO', 'REVIEW'])
    """
    thresholds = thresholds or Thresholds()
    not_gated = {k: v for k, v in (not_gated or {}).items() if k in measures}
    reasons, per_slice = [], {}
    for sname, values in measures.items():
        level = GO
        for m, lim in thresholds.for_slice(sname).items():
            v = values.get(m)
            if v is None:
                continue
            lv, interval = judged_level(m, lim, values)
            if lv != GO:
                reasons.append(Reason(sname, m, v, lim.nogo if lv == NOGO else lim.review, lv, interval))
                level = max(level, lv, key=RANK.get)
        per_slice[sname] = level
    evidence = {}
    for sname, (n, minimum) in (thin or {}).items():
        if sname in per_slice and sname not in not_gated:
            evidence[sname] = {"scored_tokens": n, "minimum": minimum, "measured_level": per_slice[sname]}
            reasons.append(Reason(sname, EVIDENCE, n, minimum, REVIEW))
            per_slice[sname] = REVIEW
    reasons.sort(key=lambda r: -RANK[r.level])
    decision = max((lv for s, lv in per_slice.items() if s not in not_gated), key=RANK.get, default=GO)
    return Verdict(decision, [r for r in reasons if r.slice not in not_gated], per_slice,
                   [r for r in reasons if r.slice in not_gated], not_gated, evidence=evidence)
