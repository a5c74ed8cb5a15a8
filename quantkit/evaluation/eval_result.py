"""An evaluation's result: the verdict, the measures per slice, the report's data; and the result
of a checkpoint judged on its files alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from quantkit.evaluation.languages import LanguageGate
from quantkit.evaluation.report import save, to_json
from quantkit.evaluation.verdict import GO, Thresholds, Verdict, decide


@dataclass
class EvalResult:
    """Everything a report shows. ``to_json()`` is the single source of the numbers."""
    meta: dict
    slices: dict[str, dict]                      # slice -> measure -> value
    buckets: dict[str, list[dict]]               # long slices: KL by position bucket
    examples: dict[str, list[dict]]              # worst examples of the slices that are not GO
    verdict: Verdict
    thresholds: Thresholds
    footprint: dict | None = None
    module_errors: dict[str, float] | None = None
    public: dict[str, bool] = field(default_factory=dict)
    languages: dict[str, str | None] = field(default_factory=dict)   # slice -> language
    gate: LanguageGate = field(default_factory=LanguageGate)
    lm_eval: dict[str, dict] = field(default_factory=dict)            # task -> metric -> base/cand/drop
    integrity: dict | None = None                                     # integrity.IntegrityReport.to_dict()
    warnings: list[str] = field(default_factory=list)                 # what was not measured, and why
    # long slices: variant of the candidate (e.g. a KV-cache option) -> its KL by position and level
    variants: dict[str, dict[str, dict]] = field(default_factory=dict)
    # scored inside a serving engine: each server's settings, the KL estimator, what it did not measure
    engine: dict | None = None

    @property
    def decision(self) -> str:
        return self.verdict.decision

    def to_json(self) -> dict:
        return to_json(self)

    def save(self, out_dir: str | Path, overwrite: bool = False, policy=None, lang: str = "en") -> Path:
        """Write report.json, report.md and report.html into ``out_dir`` (atomically); an existing
        report folder is replaced only with ``overwrite`` (``quantkit.common.outputs``). ``lang``
        ("en" or "zh") is the language of report.md and report.html; report.json is the same in both."""
        return save(self, Path(out_dir), policy, overwrite, lang)


def flagged_measures(integrity, thresholds: Thresholds) -> dict[str, dict]:
    """The integrity measures of the modules and tensors past a limit (the others stay out of the verdict)."""
    return {name: values for name, values in integrity.measures().items()
            if any(lim.level(values[m]) != GO for m, lim in thresholds.for_slice(name).items() if m in values)}


def integrity_only(integrity, thresholds: dict | Thresholds | None = None, meta: dict | None = None) -> EvalResult:
    """The result for a checkpoint that cannot be served (a tensor missing, a wrong shape or dtype):
    the integrity findings alone decide; no slice is measured."""
    th = thresholds if isinstance(thresholds, Thresholds) else Thresholds.from_dict(thresholds)
    verdict = decide(flagged_measures(integrity, th), th)
    info = {"max_len": None, "suite": [], "seconds_total": integrity.seconds,
            "slices_skipped": "the checkpoint cannot be served (see integrity): no slice was measured", **(meta or {})}
    return EvalResult(info, {}, {}, {}, verdict, th, integrity=integrity.to_dict())
