"""The smallest plan whose verdict is GO: bisect the budget, converting and evaluating each plan.

Predicted KL ranks plans; it does not decide. The verdict reads the packed checkpoint on the
evaluation slices, and the two differ (SmolLM2 GPTQ at 7.0 bits: predicted KL 0.044, measured
0.029 on the English slices). So the search spends real conversions and evaluations: one
sensitivity search, then for each budget the planner's plan is converted and evaluated.

The budget is bisected in bits per weight between a low end (the cheapest plan) and a high
end (uniform W8 channel, the usual safe point) until the lowest GO and the highest NO-GO
budgets are within a tolerance. That assumes more bits never turn a GO into a NO-GO, which
holds for the predicted damage (the planner's optimum only falls as the budget grows) and is
what a reviewer assumes reading a frontier; two budgets that plan the same formats are
evaluated once. Cost: ``2 + ceil(log2((high - low) / tolerance))`` evaluations at most.
"""
from __future__ import annotations

import math
import tempfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from quantkit.errors import QuantkitError
from quantkit.evaluation.verdict import GO
from quantkit.common.jsonio import dumps_strict
from quantkit.workflows import convert as api
from quantkit.workflows.measure_sensitivity import sensitivity
from quantkit.sensitivity.planner import plan
from quantkit.sensitivity.search import SearchOptions
from quantkit.sensitivity.data import Sensitivity

if TYPE_CHECKING:
    from quantkit.workflows.convert import ConvertOptions
    from quantkit.workflows.quantized_model import QuantizedModel
    from quantkit.recipe import Recipe
    from quantkit.sensitivity.data import Sensitivity
    from quantkit.config.mixed_section import SmallestGo

RESULT_FILE = "smallest_go.json"


@dataclass
class Trial:
    """One budget tried: the plan it gave and the verdict on its checkpoint."""

    budget_bits: float
    bits_per_weight: float
    nbytes: int
    predicted_kl: float
    decision: str
    same_plan_as: float | None = None   # the budget whose identical plan was evaluated instead


@dataclass
class GoSearch:
    low_bits: float
    high_bits: float
    tolerance_bits: float
    trials: list[Trial] = field(default_factory=list)
    found: Trial | None = None           # the smallest GO; None: no budget up to high_bits is GO

    def to_dict(self) -> dict:
        return {"kind": "quantkit-smallest-go", "version": 1, "low_bits": self.low_bits, "high_bits": self.high_bits,
                "tolerance_bits": self.tolerance_bits, "found": None if self.found is None else asdict(self.found),
                "trials": [asdict(t) for t in self.trials]}


def bisect_go(low: float, high: float, tolerance: float, trial: Callable[[float], Trial]) -> GoSearch:
    """The smallest budget in [low, high] whose ``trial`` is GO, to within ``tolerance`` bits.

    The high end is tried first (nothing above it is searched: no GO there ends the search), then
    the low end, then the middle of the interval between the lowest GO plan's size and the
    highest NO-GO budget, until they are within ``tolerance``.

    >>> s = bisect_go(4.0, 8.0, 0.5, lambda b: Trial(b, b, int(b * 100), 0.0, "GO" if b >= 6.2 else "NO-GO"))
    >>> [t.budget_bits for t in s.trials], s.found.budget_bits
    ([8.0, 4.0, 6.0, 7.0, 6.5], 6.5)
    """
    search = GoSearch(low, high, tolerance)

    def run(budget: float) -> Trial:
        t = trial(budget)
        search.trials.append(t)
        return t

    top = run(high)
    if top.decision != GO:
        return search
    search.found = top
    bottom = run(low)
    if bottom.decision == GO:
        search.found = bottom
        return search
    lo, hi = low, top.bits_per_weight
    while hi - lo > tolerance:
        t = run((lo + hi) / 2)
        if t.decision == GO:
            search.found, hi = t, t.bits_per_weight
        else:
            lo = t.budget_bits
    return search


def default_bounds(sens: "Sensitivity", candidates: list[str] | None, settings: "SmallestGo") -> tuple[float, float]:
    """``settings``' bounds, else the cheapest plan and uniform W8 channel (else the costliest plan)."""
    allowed = list(sens.candidates) if candidates is None else list(candidates)
    params = sens.params()
    sizes = [[sens.nbytes[u.name][c] for c in allowed if c in sens.nbytes[u.name]] for u in sens.units]
    cheapest = 8 * (sum(min(s) for s in sizes) + 0.5) / params   # half a byte: the planner floors bits to bytes
    if "W8_CHANNEL" in allowed and all("W8_CHANNEL" in sens.nbytes[u.name] for u in sens.units):
        top = 8 * sum(sens.nbytes[u.name]["W8_CHANNEL"] for u in sens.units) / params
    else:
        top = 8 * sum(max(s) for s in sizes) / params
    low = settings.low_bits if settings.low_bits is not None else cheapest
    high = settings.high_bits if settings.high_bits is not None else top
    if high <= low:
        raise QuantkitError(f"mixed.smallest_go: high_bits {high:.4g} is not above low_bits {low:.4g}")
    return low, high


def smallest_go(model, recipe: "Recipe", calibration=None, *, evaluate: Callable[[Path], str],
                workdir: Path | None = None, log: Callable[[str], None] = print,
                options: "ConvertOptions | None" = None) -> tuple["QuantizedModel | None", GoSearch]:
    """Search the smallest GO plan for ``recipe`` (whose ``mixed.smallest_go`` is set).

    ``evaluate(checkpoint_folder) -> decision`` is the verdict (``convert_checkpoint``'s: the
    recipe's eval section, the report written into the checkpoint's ``eval/``, the decision
    returned as the evaluation's value). Returns the checkpoint of the
    smallest GO plan, unsaved (``.save(out)`` moves it into place), with ``smallest_go.json``
    inside, and the search; without a GO plan, the high end's checkpoint. ``options``: how each
    plan is converted (its ``workdir`` and ``log`` are this call's).
    """

    m = recipe.mixed
    if m is None or m.smallest_go is None:
        raise QuantkitError(f"{recipe.origin}: mixed.smallest_go is not set (--budget go)")
    convert_options = replace(options if options is not None else api.ConvertOptions(), workdir=workdir, log=log)
    names = None if m.candidates is None else [c.name for c in m.candidates]
    with tempfile.TemporaryDirectory(prefix=".quantkit-go-", dir=workdir) as tmp:
        if m.sensitivity is not None:
            sens_path = Path(m.sensitivity)
            sens = Sensitivity.load(sens_path)
        else:
            cands = None if m.candidates is None else [asdict(c) for c in m.candidates]
            sens = sensitivity(model, recipe, calibration, candidates=cands,
                                   options=SearchOptions(tokens=m.tokens, labels=m.labels), log=log)
            if m.method is not None:
                sens.method = m.method
            sens_path = sens.save(Path(tmp) / "sensitivity.json")
        low, high = default_bounds(sens, names, m.smallest_go)
        log(f"smallest GO: bisecting {low:.3f}-{high:.3f} bits per weight to {m.smallest_go.tolerance_bits} bits "
            f"(at most {2 + max(0, math.ceil(math.log2((high - low) / m.smallest_go.tolerance_bits)))} conversions "
            "and evaluations)")
        seen: dict[tuple, Trial] = {}            # plan -> its trial: one evaluation per distinct plan
        checkpoints: dict[tuple, "QuantizedModel"] = {}   # the high end's and the best GO's only
        keys: dict[int, tuple] = {}

        def trial(budget: float) -> Trial:
            p = plan(sens, budget, None, names)
            key = tuple(sorted(p.choice.items()))
            if key in seen:
                t = replace(seen[key], budget_bits=budget, same_plan_as=seen[key].budget_bits)
                keys[id(t)] = key
                return t
            per = replace(recipe, mixed=replace(m, smallest_go=None, budget_bits=budget, budget_bytes=None,
                                                sensitivity=str(sens_path)))
            log(f"smallest GO: budget {budget:.3f} bits -> plan {p.bits_per_weight:.3f} bits, predicted KL "
                f"{p.predicted_kl:.4g}; converting")
            q = api.quantize(model, per, calibration, convert_options)
            decision = evaluate(q.path)
            log(f"smallest GO: {p.bits_per_weight:.3f} bits per weight: {decision}")
            t = Trial(budget, round(p.bits_per_weight, 4), p.nbytes, p.predicted_kl, decision)
            seen[key], keys[id(t)] = t, key
            if not checkpoints:          # the high end: kept, the answer when nothing is GO
                checkpoints[key] = q
            elif decision == GO:         # a smaller GO than the last: the last one's folder goes
                for k in list(checkpoints)[1:]:
                    del checkpoints[k]
                checkpoints[key] = q
            return t

        search = bisect_go(low, high, m.smallest_go.tolerance_bits, trial)
    found = keys.get(id(search.found)) if search.found is not None else None
    chosen = checkpoints.get(found) if found is not None else checkpoints.get(keys[id(search.trials[0])])
    if chosen is not None:
        (chosen.path / RESULT_FILE).write_text(dumps_strict(search.to_dict(), indent=1) + "\n", encoding="utf-8")
    return chosen, search
