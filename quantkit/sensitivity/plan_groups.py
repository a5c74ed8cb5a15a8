"""A plan applied to a recipe: compressed-tensors ``config_groups``, one per format, and ``ignore``.

The format most units take is the group that targets the class (``Linear``) when the recipe
targeted every Linear too (else it lists names as well); every other format's group lists its
modules by exact name, which compressed-tensors (and quantkit's
``group_for``) ranks above a class, so each module falls under its planned group with no
tie. Kept units go to ``ignore``. The recipe's steps, calibration and ignore list are kept.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from quantkit.errors import QuantkitError
from quantkit.recipe import Recipe
from quantkit.config.scheme import QuantScheme
from quantkit.sensitivity.data import Sensitivity
from quantkit.sensitivity.planner import Plan


def group_key(cand: str) -> str:
    return cand.lower()


def planned_recipe(recipe: Recipe, sens: Sensitivity, plan: Plan) -> Recipe:
    """``recipe`` with its groups and ignore list replaced by the plan's."""
    units = {u.name: u for u in sens.units}
    missing = [u for u in units if u not in plan.choice]
    if missing:
        raise QuantkitError(f"plan: no format chosen for {missing[0]} ({len(missing)} units)")
    quantized = Counter(c for c in plan.choice.values() if sens.candidates[c] is not None)
    if not quantized:
        raise QuantkitError("plan: every unit is kept in high precision; nothing to quantize")
    main = quantized.most_common(1)[0][0]
    by_class = any("Linear" in s.targets for s in recipe.groups.values())
    groups: dict[str, QuantScheme] = {}
    ignore = list(recipe.ignore)
    for cand in sens.candidates:
        members = tuple(m for name, c in plan.choice.items() if c == cand for m in units[name].members)
        if cand == main and by_class:
            groups[group_key(cand)] = QuantScheme(("Linear",), sens.candidates[cand])
            continue
        if not members:
            continue
        if sens.candidates[cand] is None:
            ignore.extend(members)
        else:
            groups[group_key(cand)] = QuantScheme(members, sens.candidates[cand])
    return dataclasses.replace(recipe, groups=groups, ignore=tuple(dict.fromkeys(ignore)))
