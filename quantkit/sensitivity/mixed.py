"""A recipe's ``mixed:`` section carried out before conversion: search (or reuse), plan, apply.

The search needs the float model and calibration samples; the plan is a pure function of the
result; the planned recipe is an ordinary recipe the layer loop converts. The sensitivity
data and the plan are returned so the conversion can write them beside the checkpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from quantkit.errors import QuantkitError
from quantkit.config.candidates import candidate, check_candidates, DEFAULT_CANDIDATES, fits, like
from quantkit.sensitivity.data import Sensitivity
from quantkit.sensitivity.units import plan_units
from quantkit.arch.experts import moe_spec
from quantkit.sensitivity.plan_groups import planned_recipe
from quantkit.sensitivity.planner import plan
from quantkit.sensitivity.search import DEFAULT_METHOD, SearchOptions, sensitivity_search
import math

if TYPE_CHECKING:
    from torch import nn

    from quantkit.recipe import Recipe
    from quantkit.sensitivity.data import Sensitivity
    from quantkit.sensitivity.planner import Plan

SENSITIVITY_FILE, PLAN_FILE = "sensitivity.json", "plan.json"


def check_mixed(recipe: "Recipe", config) -> "Sensitivity | list":
    """What ``recipe.mixed`` plans from, checked before any data is read: the sensitivity file
    (loaded, and its units this model's) or the candidates to search (the budget reachable)."""


    m = recipe.mixed
    where = f"{recipe.origin}: mixed"
    if moe_spec(config) is not None:
        # the search scores each linear on the fused float model, and vLLM's MoE layer takes one
        # format for all of a block's experts: neither is built for experts yet
        raise QuantkitError(f"{where}: mixed precision does not plan MoE models yet "
                            f"({config.architectures[0]}); quantize with one scheme")
    if m.smallest_go is not None:
        raise QuantkitError(f"{where}.smallest_go: a search that converts and evaluates a plan per budget: "
                            "run it with quantkit convert --budget go or quantkit.smallest_go(), not quantize()")
    if not m.has_budget:
        raise QuantkitError(f"{where}: needs budget_bits or budget_bytes (or --budget)")
    if m.sensitivity is not None:
        sens = Sensitivity.load(m.sensitivity)
        units = [u.name for u in plan_units(config, recipe)[0]]
        if [u.name for u in sens.units] != units:
            raise QuantkitError(f"{m.sensitivity}: its units are not this model's under this recipe "
                                f"({len(sens.units)} units, the model has {len(units)}): search again")
        if m.method is not None:
            if m.method not in sens.scores:
                raise QuantkitError(f"{where}.method: '{m.method}' is not in {m.sensitivity}")
            sens.method = m.method
        return sens
    groups = list(recipe.groups.values())
    base = groups[0].weights if len(groups) == 1 else None
    cands = [like(c, base) for c in (m.candidates or [candidate(n) for n in DEFAULT_CANDIDATES])]
    check_candidates(cands, f"{where}.candidates")
    _check_reachable(config, recipe, cands)
    return cands


def plan_recipe(recipe: "Recipe", config, source: "Sensitivity | list", samples: list[list[int]] | None,
                float_model: Callable[[], "nn.Module"], log: Callable[[str], None]) -> tuple["Recipe", "Sensitivity", "Plan"]:
    """The recipe with its groups planned under ``recipe.mixed``'s budget, from ``source``
    (``check_mixed``'s result: sensitivity data, or the candidates to search now)."""

    m = recipe.mixed
    if isinstance(source, list):
        options = SearchOptions(tokens=m.tokens, labels=m.labels, method=m.method or DEFAULT_METHOD)
        sens = sensitivity_search(float_model(), config, recipe, samples, source, options, log=log)
        log(f"mixed precision: sensitivity search {sens.seconds['total']:.1f} s")
    else:
        sens = source
        log(f"mixed precision: sensitivity from {m.sensitivity}")
    names = None if m.candidates is None else [c.name for c in m.candidates]
    p = plan(sens, m.budget_bits, m.budget_bytes, names)
    shares = ", ".join(f"{c} {row['params'] / p.params:.0%}" for c, row in p.by_candidate(sens).items())
    log(f"mixed precision: {p.bits_per_weight:.3f} bits per weight ({shares}), predicted KL {p.predicted_kl:.4g}")
    return planned_recipe(recipe, sens, p), sens, p


def _check_reachable(config, recipe: "Recipe", cands) -> None:
    """The budget against the cheapest plan of these candidates, from sizes alone."""


    m = recipe.mixed
    units, dtype = plan_units(config, recipe)
    floor, ceiling, params = 0, 0, 0
    for u in units:
        sizes = [u.nbytes(c.weights, dtype) for c in cands if all(fits(c.weights, i) for _, i in u.shapes)]
        if not sizes:
            raise QuantkitError(f"{recipe.origin}: mixed.candidates: none fits {u.name} (in_features "
                                f"{', '.join(str(i) for _, i in u.shapes)})")
        floor += min(sizes)
        ceiling += max(sizes)
        params += u.params
    cap = math.floor(m.budget_bits * params / 8) if m.budget_bits is not None else m.budget_bytes
    said = f"{m.budget_bits} bits per weight" if m.budget_bits is not None else f"{m.budget_bytes} bytes"
    if floor > cap:
        raise QuantkitError(f"budget: {said} is below the smallest plan of these candidates "
                            f"({8 * floor / params:.4g} bits per weight, {floor} bytes)")
    if cap > ceiling:
        # every unit in its most precise candidate already fits: a search would only confirm that
        raise QuantkitError(f"budget: {said} is above the largest plan of these candidates "
                            f"({8 * ceiling / params:.4g} bits per weight, {ceiling} bytes, every unit at its "
                            "most precise): give a budget in between")
