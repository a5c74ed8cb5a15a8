"""The recipe's steps on one decoder layer: its targets, its ``LayerContext``, the transforms, the quantizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from quantkit.steps import Algorithm, LayerContext, QuantizedWeight, Step, Transform, TransformResult, build_algorithm
from quantkit.errors import QuantkitError
from quantkit.formats.compressed_tensors import group_for
from quantkit.recipe import Recipe
from quantkit.config.scheme import QuantScheme
from quantkit.pipeline import record, residuals
from quantkit.pipeline.state import RunState

Targets = dict[str, tuple[nn.Linear, QuantScheme]]


def build_steps(recipe: Recipe) -> tuple[list[tuple[str, Transform]], Algorithm]:
    """The recipe's chain as step objects: (key, transform) pairs, then the quantizer."""
    transforms: list[tuple[str, Transform]] = []
    quantizer: Algorithm | None = None
    for k, spec in enumerate(recipe.steps):
        step: Step = build_algorithm(spec.name, spec.options, where=f"steps[{k}]")
        if isinstance(step, Transform):
            transforms.append((record.step_key(k, spec.name), step))
        else:
            quantizer = step   # the recipe's validation puts exactly one quantizer, last
    return transforms, quantizer


def layer_groups(layer: nn.Module, prefix: str, recipe: Recipe) -> dict[str, tuple[nn.Linear, str]]:
    """The layer's target linears (names within the layer) -> (module, config group key)."""
    out = {}
    for name, m in layer.named_modules():
        if isinstance(m, nn.Linear):
            g = group_for(f"{prefix}{name}", "Linear", recipe.groups, list(recipe.ignore), where=recipe.origin)
            if g is not None:
                out[name] = (m, g)
    return out


def layer_targets(layer: nn.Module, prefix: str, recipe: Recipe) -> Targets:
    return {name: (m, recipe.groups[g]) for name, (m, g) in layer_groups(layer, prefix, recipe).items()}


def no_data(**_: Any) -> None:
    raise QuantkitError("calibration: this step ran the layer but no calibration data was captured")


def layer_context(state: RunState, i: int, layer: nn.Module, targets: Targets, kv=None) -> LayerContext:
    """What the steps see of decoder layer ``i``: its targets, and passes over the calibration data
    (``kv``: the attention module and the observer its keys and values go to in a propagating pass)."""
    name, spec, passes = f"{state.spec.layers}.{i}", state.spec, state.passes
    subgroups = spec.layer_subgroups(list(targets))
    if passes is None:
        return LayerContext(i, name, layer, targets, subgroups, run=no_data, num_samples=state.num_samples,
                            num_tokens=state.num_tokens, arch=spec, config=state.config)
    ctx: LayerContext

    def run(propagate: bool = False, interleaved: bool = False, batches: list[int] | None = None) -> None:
        passes.run(layer, i, propagate=propagate, interleaved=interleaved, batches=batches,
                   observe=ctx.targets, observed=ctx.observed if propagate else None, kv=kv)

    ctx = LayerContext(i, name, layer, targets, subgroups, run=run, num_samples=state.num_samples,
                       num_tokens=state.num_tokens, single_pass=state.calibration.single_pass, arch=spec,
                       config=state.config, num_batches=passes.count, tokens=passes.tokens(name), sync=passes.sync,
                       batch_index=passes.batch_index)
    if passes.float_hidden is not None:
        ctx.forward_float = lambda: passes.run_float(layer, i)
    return ctx


def run_transforms(ctx: LayerContext, transforms: list[tuple[str, Transform]], out_dir: Path) -> dict[str, TransformResult]:
    """Each transform searches (or reloads its saved result) and applies it, in the recipe's order."""
    found: dict[str, TransformResult] = {}
    for key, step in transforms:
        load_from = getattr(step, "load_from", None)
        if load_from:
            result = record.load_result(load_from, ctx.index, ctx.name, key, f"steps[{key.split('.')[0]}].{step.name}")
        else:
            result = step.search(ctx)
        step.apply(ctx, result)
        found[key] = result
    record.save_layer(out_dir, ctx.index, found)
    return found


def quantize_targets(quantizer: Algorithm, ctx: LayerContext, prefix: str,
                     rows: dict[str, torch.Tensor]) -> dict[str, QuantizedWeight]:
    """The quantizer on ``ctx``'s targets; their dequantized weights written back, so the layer's
    outputs (the next layer's inputs) are the quantized model's own, and what it left per row
    recorded into ``rows`` (in float32, as the integrity pass decodes)."""
    # the weights the quantizer is given (GPTQ updates its working copy in place), for the row record
    given = {name: m.weight.data.clone() for name, (m, _) in ctx.targets.items()}
    results = quantizer.quantize_layer(ctx)
    missing = set(ctx.targets) - set(results)
    if missing:
        raise RuntimeError(f"{quantizer.name} returned no result for {sorted(missing)}")
    for name, (m, s) in ctx.targets.items():
        rows[prefix + name] = residuals.row_errors(given.pop(name), results[name].dequantized(s.weights, torch.float32))
        m.weight.data = results[name].dequantized(s.weights, m.weight.dtype)
    return results
