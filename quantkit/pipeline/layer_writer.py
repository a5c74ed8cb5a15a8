"""What the layer loop writes: each layer's tensors from the layer in memory, then the checkpoint's
``config.json`` and ``quantization_log.json``."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from quantkit.steps import QuantizedWeight
from quantkit.errors import QuantkitError
from quantkit.arch.experts import UnfusedExperts
from quantkit.formats.compressed_tensors import checkpoint_dtype, compress_module, quantization_config, scheme_for
from quantkit.formats.writer import ShardWriter
from quantkit.common.jsonio import nonfinite_warning, tagged_floats
from quantkit.kv_cache import KVObserver
from quantkit.numerics.primitives import calculate_qparams
from quantkit.numerics.fp4_numerics import nvfp4_global_scale
from quantkit.config.scheme import fp4_kind
from quantkit.pipeline.coverage import coverage_lines
from quantkit.pipeline.onload import config_dtype
from quantkit.pipeline.resume import LayerLog
from quantkit.pipeline.state import RunState
from quantkit import __version__


def static_targets(targets) -> list[str]:
    """The targets whose input scales are calibrated (static activations)."""
    return [n for n, (_, s) in targets.items() if s.input_activations is not None and s.input_activations.calibrated]


def write_layer(writer: ShardWriter, prefix: str, params: list[tuple[str, torch.Tensor]], targets,
                results: dict[str, QuantizedWeight], observed: dict[str, torch.Tensor], log: LayerLog) -> None:
    """Every tensor of the layer (``params``: its parameters, named within it), from the layer in
    memory: packed targets, everything else as it now is."""
    written = set()
    for name, (m, s) in targets.items():
        r = results[name]
        input_scale = _input_scale(prefix + name, m, s, observed.get(name))
        for k, t in compress_module(r.q, r.scale, r.zero_point, r.g_idx, s, m.bias, input_scale,
                                    r.global_scale).items():
            writer.add(f"{prefix}{name}.{k}", t)
        written.update({f"{name}.weight", f"{name}.bias"})
        log.stats[f"{prefix}{name}"] = {"format": s.format, **r.stats}
        log.formats[s.format] = log.formats.get(s.format, 0) + 1
    for pname, p in params:
        if pname not in written:
            writer.add(f"{prefix}{pname}", p.data)


def _input_scale(where: str, m: nn.Linear, s, amax: torch.Tensor | None) -> torch.Tensor | None:
    """A static activation's scale from the largest magnitude its linear's inputs reached."""
    if amax is not None and fp4_kind(s.input_activations) == "nvfp4":
        return nvfp4_global_scale(amax.to(m.weight.dtype))
    if amax is not None:
        amax = amax.reshape(1)
        input_scale, _ = calculate_qparams(-amax, amax, s.input_activations, dtype=m.weight.dtype)
        return input_scale
    if s.input_activations is not None and s.input_activations.calibrated:
        raise QuantkitError(f"{where}: no calibration token reached it, so its static input scale "
                            "cannot be calibrated (an MoE expert no token was routed to: set "
                            "calibration.moe_experts: all)")
    return None


def write_kv_scales(state: RunState, prefix: str, kv: tuple[nn.Module, KVObserver]) -> None:
    """The layer's k_scale / v_scale, on its attention module."""
    attention, observer = kv
    dtype = next(attention.parameters()).dtype   # compressed-tensors: the attention module's dtype
    for leaf, scale in observer.scales(state.recipe.kv_cache, dtype).items():
        state.writer.add(f"{prefix}{state.spec.attention}.{leaf}", scale)


# docs/PLATFORM.md, "transformers": its loader drops the per-expert global scale
NVFP4_EXPERTS_NOTE = ("NVFP4 experts: transformers 5.25 with compressed-tensors reads per-expert NVFP4 weights without "
                      "their weight_global_scale (wrong experts, no error); read this checkpoint with quantkit.load or "
                      "vLLM, not plain transformers (docs/PLATFORM.md)")


def write_metadata(state: RunState) -> None:
    """``config.json`` with its ``quantization_config``, and ``quantization_log.json``."""
    recipe, lg = state.recipe, state.log
    cfg = state.config.to_dict()
    groups_used = {g: recipe.groups[g] for g in lg.groups}
    cfg["quantization_config"] = quantization_config(groups_used or recipe.groups, _ignored(state),
                                                     recipe.kv_cache.to_dict() if recipe.kv_cache else None)
    cfg["dtype"] = str(checkpoint_dtype(set(lg.formats), config_dtype(state.config))).removeprefix("torch.")
    cfg.pop("torch_dtype", None)
    warn = state.options.warn or state.options.log
    if state.spec.moe is not None and "nvfp4-pack-quantized" in lg.formats and warn is not None:
        warn(NVFP4_EXPERTS_NOTE)
    write_strict(state.writer, "config.json", tagged_floats(cfg), warn)
    quant_log: dict[str, Any] = {
        "quantkit_version": _version(), "recipe": recipe.to_dict(), "architecture": state.arch_name,
        "calibration": {"num_samples": state.num_samples, "num_tokens": state.num_tokens},
        "modules": lg.stats,
    }
    if lg.transforms:
        quant_log["transforms"] = lg.transforms
    if lg.experts:
        quant_log["moe_coverage"] = _coverage(state)
    write_strict(state.writer, "quantization_log.json", quant_log, warn)


def write_strict(writer: ShardWriter, name: str, data: dict, warn: Callable[[str], None] | None) -> None:
    """``data`` as ``name`` (non-finite numbers as null: strict JSON), saying which fields were not finite."""
    message = nonfinite_warning(data, name)
    if message is not None and warn is not None:
        warn(message)
    writer.write_json(name, data)


def _ignored(state: RunState) -> list[str]:
    """The Linear modules kept in high precision (those outside the decoder layers too), and the
    MoE routers: an engine (vLLM's routers are linear layers) would otherwise apply the groups'
    "Linear" target to them."""
    recipe, model = state.recipe, state.model
    inside = state.spec.layers + "."
    # linears outside the decoder layers (a vision tower, its projector) are written as read
    ignore = [n for n, m in model.named_modules()
              if isinstance(m, nn.Linear) and (scheme_for(n, "Linear", recipe.groups, list(recipe.ignore)) is None
                                              or not n.startswith(inside))]
    if state.spec.moe is not None:
        routers = [f"{name.rsplit('.', 1)[0]}.{state.spec.moe.router}" for name, m in model.named_modules()
                   if isinstance(m, UnfusedExperts)]
        ignore += [n for n in routers if n not in ignore]
    return ignore


def _coverage(state: RunState) -> dict[str, Any]:
    """The MoE calibration coverage (tokens per expert), also said to the log."""
    settings, layers = state.recipe.calibration, state.log.experts
    for line in coverage_lines(layers, settings.moe_experts, settings.moe_min_tokens):
        state.say(line)
    return {"mode": settings.moe_experts, "min_tokens": settings.moe_min_tokens, "layers": layers,
            "under_min": {n: r["under_min"] for n, r in layers.items() if r["under_min"]}}


def _version() -> str:

    return __version__
