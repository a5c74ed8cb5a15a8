"""What a recipe says about a model's Linear modules, checked before any data is read."""

from __future__ import annotations

from typing import Callable, Sequence

from torch import nn

from quantkit.arch.lookup import arch_for
from quantkit.errors import QuantkitError
from quantkit.formats.compressed_tensors import group_for, matches
from quantkit.pipeline.fold_coverage import check_fold_coverage
from quantkit.pipeline.onload import build_skeleton
from quantkit.pipeline.rotated_source import check_rotation
from quantkit.recipe import Recipe


def check_modules(config, recipe: Recipe, required: Sequence[str], warn: Callable[[str], None],
                  planned: bool = False) -> None:
    """What the recipe says about the model's Linear modules, checked before any data is read:
    no two config groups target one module equally specifically, each group size divides the
    width of the modules it quantizes, and each ``ignore`` entry
    keeps some module in high precision (one given in ``required``, ``--ignore``, fails when
    it matches none; one from the recipe warns)."""

    if any(step.name == "rotate" for step in recipe.steps):
        check_rotation(config, arch_for(config)[1], recipe)
    check_fold_coverage(*arch_for(config), recipe, warn)
    if recipe.kv_cache is not None and arch_for(config)[1].attention is None:
        raise QuantkitError(f"{recipe.origin}: kv_cache: {arch_for(config)[0]}: {arch_for(config)[1].kv_cache_blocked}")
    linears = {n: m for n, m in build_skeleton(config).named_modules() if isinstance(m, nn.Linear)}
    names = list(linears)
    quantized = 0
    inside = arch_for(config)[1].layers + "."
    for name, m in linears.items():
        if not name.startswith(inside):   # a vision tower's linears are written as read (in ignore)
            continue
        group = group_for(name, "Linear", recipe.groups, list(recipe.ignore), where=recipe.origin)
        s = recipe.groups[group] if group is not None else None
        if s is not None and s.weights is not None:
            s.weights.check_width(m.in_features, f"config_groups.{group}.weights ({name})", m.out_features)
            if s.input_activations is not None:
                s.input_activations.check_width(m.in_features, f"config_groups.{group}.input_activations ({name})")
            quantized += 1
    if names and not quantized and recipe.kv_cache is None and not planned:
        _nothing_quantized(recipe, names, required)
    for pattern in recipe.ignore:
        if pattern == "lm_head" or any(matches(n, "Linear", pattern) for n in names):
            continue
        like = f" (its Linear modules are named like '{names[0]}')" if names else ""
        if pattern in required:
            raise QuantkitError(f"--ignore: '{pattern}' matches no Linear module of the model{like}")
        warn(f"ignore: '{pattern}' matches no Linear module of the model, so it keeps nothing in high precision{like}")


def _nothing_quantized(recipe: Recipe, names: list[str], required: Sequence[str]) -> None:
    """A conversion that would quantize no Linear module writes an unquantized copy under a
    quantized name: refused, naming what kept everything in high precision."""
    ignore = [p for p in recipe.ignore if p != "lm_head"]
    culprit = ([f"--ignore '{p}'" for p in required if p in ignore]
               or [f"ignore: '{p}'" for p in ignore] or ["its config_groups' targets"])
    raise QuantkitError(f"{culprit[0]}: keeps all {len(names)} Linear modules of the model in high precision "
                        "(or none is targeted): nothing would be quantized")
