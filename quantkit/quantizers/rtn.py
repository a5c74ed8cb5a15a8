"""Round-to-nearest: each weight quantized on its own grid, no calibration data."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.config.scheme import fp4_kind
from quantkit.numerics.fp4 import dequantize_fp4, nvfp4_global_scale, quantize_fp4_weight
from quantkit.numerics.primitives import dequantize, quantize_weight, sqnr_db
from quantkit.steps.base import Algorithm, LayerContext, QuantizedWeight, register_algorithm


@register_algorithm("rtn")
@dataclass
class RTN(Algorithm):
    """Round to nearest on the scheme's grid (min-max, or MSE-clipped with ``observer: mse``)."""

    def quantize_layer(self, ctx: LayerContext) -> dict[str, QuantizedWeight]:
        out = {}
        shared = shared_global_scales(ctx)
        for name, (module, scheme) in ctx.targets.items():
            w = module.weight.data
            args = scheme.weights
            if fp4_kind(args) is not None:
                out[name] = _rtn_fp4(w, fp4_kind(args), shared.get(name))
                continue
            q, scale, zp = quantize_weight(w, args)
            stats = {"sqnr_db": round(sqnr_db(w, dequantize(q, scale, zp, args)), 3)}
            out[name] = QuantizedWeight(q, scale, zp, None, stats)
        return out


def shared_global_scales(ctx: LayerContext) -> dict[str, torch.Tensor]:
    """One NVFP4 weight global scale for the linears that read one input (q/k/v, gate/up).

    vLLM fuses them into one linear with one global scale (the largest stored, with a warning
    when they differ), so each gets the scale of their largest weight: the smallest of their
    own, as llm-compressor shares it. Linears alone in their sub-group keep their own.
    """
    out: dict[str, torch.Tensor] = {}
    for group in ctx.subgroups:
        members = [n for n in group if n in ctx.targets and fp4_kind(ctx.targets[n][1].weights) == "nvfp4"]
        if len(members) < 2:
            continue
        weights = [ctx.targets[n][0].weight.data for n in members]
        amax = torch.stack([w.abs().amax().to(weights[0].dtype) for w in weights]).amax()
        out.update({n: nvfp4_global_scale(amax) for n in members})
    return out


def _rtn_fp4(w: torch.Tensor, kind: str, global_scale: torch.Tensor | None) -> QuantizedWeight:
    """FP4 on the format's own scales (min-max groups under NVFP4's global scale)."""
    q = quantize_fp4_weight(w, kind, global_scale)
    stats = {"sqnr_db": round(sqnr_db(w, dequantize_fp4(q, kind)), 3)}
    return QuantizedWeight(q.codes, q.scale, None, None, stats, q.global_scale)
