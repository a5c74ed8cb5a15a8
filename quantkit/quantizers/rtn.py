"""Round-to-nearest: each weight quantized on its own grid, no calibration data."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.config.scheme import QuantArgs, fp4_kind
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
            out[name] = rtn_weight(module.weight.data, scheme.weights, shared.get(name))
        return out


def rtn_weight(w: torch.Tensor, args: QuantArgs, global_scale: torch.Tensor | None = None) -> QuantizedWeight:
    """One weight rounded to nearest on ``args``' grid (``global_scale``: NVFP4's, shared with
    its sub-group's siblings; None: its own). The model-free conversion calls it tensor by
    tensor, so both paths give the same bytes."""
    kind = fp4_kind(args)
    if kind is not None:
        return _rtn_fp4(w, kind, global_scale)
    q, scale, zp = quantize_weight(w, args)
    stats = {"sqnr_db": round(sqnr_db(w, dequantize(q, scale, zp, args)), 3)}
    return QuantizedWeight(q, scale, zp, None, stats)


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
        out.update({n: shared_global_scale([w.abs().amax() for w in weights], weights[0].dtype) for n in members})
    return out


def shared_global_scale(amaxes: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """NVFP4's global scale for linears whose largest magnitudes are ``amaxes`` (held in ``dtype``,
    the first one's): a streaming caller reads each weight once for its amax, never all at once."""
    return nvfp4_global_scale(torch.stack([a.to(dtype) for a in amaxes]).amax())


def _rtn_fp4(w: torch.Tensor, kind: str, global_scale: torch.Tensor | None) -> QuantizedWeight:
    """FP4 on the format's own scales (min-max groups under NVFP4's global scale)."""
    q = quantize_fp4_weight(w, kind, global_scale)
    stats = {"sqnr_db": round(sqnr_db(w, dequantize_fp4(q, kind)), 3)}
    return QuantizedWeight(q.codes, q.scale, None, None, stats, q.global_scale)
