"""Whether the steps that fold per-channel scales (AWQ, SmoothQuant) have places to fold them.

A family in the architecture table lists its mappings; a derived one has only those its traced
forward shows exactly (``arch/derive.py``). Scales are never folded where that is not shown:
a step with no mapping at all is refused before any data is read, and the linears that no
mapping reaches are named in a warning (they are quantized without scales).
"""

from __future__ import annotations

from typing import Callable

from quantkit.arch.spec import ArchSpec
from quantkit.errors import QuantkitError
from quantkit.steps.base import ALGORITHMS


def check_fold_coverage(arch: str, spec: ArchSpec, recipe, warn: Callable[[str], None]) -> None:
    """Refuse a scale-folding step on a model with no mapping; warn which sub-groups none reaches."""
    for k, step in enumerate(recipe.steps):
        if not getattr(ALGORITHMS.get(step.name), "folds_scales", False):
            continue
        where = f"{recipe.origin}: steps[{k}].{step.name}"
        if not spec.smooth_mappings:
            raise QuantkitError(f"{where}: {arch} has no place to fold scales: in its traced forward no norm's or "
                                "linear's output reaches only linears (describe the family in quantkit/arch/)")
        if spec.derived:
            covered = {n for m in spec.smooth_mappings for n in m.balance}
            bare = [g for g in spec.subgroups if not set(g) & covered]
            if bare:
                shown = ", ".join("+".join(g) for g in bare)
                warn(f"{where}: {arch}: {shown} read no norm's or linear's output alone, so no scales fold into "
                     "them; they are quantized without")
