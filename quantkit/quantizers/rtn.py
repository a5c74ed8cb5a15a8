"""Round-to-nearest: each weight quantized on its own grid, no calibration data (except for the
``imatrix_mse`` observer, which weighs each column by its mean squared input)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.config.scheme import QuantArgs
from quantkit.numerics.number_formats import number_format
from quantkit.numerics.primitives import sqnr_db
from quantkit.quantizers.importance import input_importance
from quantkit.steps.base import Algorithm, LayerContext, QuantizedWeight, register_algorithm


@register_algorithm("rtn")
@dataclass
class RTN(Algorithm):
    """Round to nearest on the scheme's grid (min-max, MSE-clipped with ``observer: mse``, or
    clipped by the activation-weighted MSE with ``observer: imatrix_mse``)."""

    def quantize_layer(self, ctx: LayerContext) -> dict[str, QuantizedWeight]:
        out = {}
        shared = shared_global_scales(ctx)
        weighted = [n for n, (_, s) in ctx.targets.items() if s.weights is not None and s.weights.observer == "imatrix_mse"]
        importance = input_importance(ctx, weighted)
        for name, (module, scheme) in ctx.targets.items():
            out[name] = rtn_weight(module.weight.data, scheme.weights, shared.get(name), importance.get(name))
        return out


def rtn_weight(w: torch.Tensor, args: QuantArgs, global_scale: torch.Tensor | None = None,
               importance: torch.Tensor | None = None) -> QuantizedWeight:
    """One weight rounded to nearest on ``args``' grid (``global_scale``: the format's per-tensor
    scale shared with its sub-group's siblings; None: its own; ``importance``: each column's mean
    squared input, for ``imatrix_mse``). The model-free conversion calls it tensor by tensor, so
    both paths give the same bytes."""
    fmt = number_format(args)
    qp = fmt.scales(w, global_scale=global_scale, importance=importance)
    q = fmt.quantize(w, qp)
    stats = {"sqnr_db": round(sqnr_db(w, fmt.dequantize(q, qp)), 3)}
    return QuantizedWeight(q, qp.scale, qp.zero_point, None, stats, qp.global_scale)


def shared_global_scales(ctx: LayerContext) -> dict[str, torch.Tensor]:
    """One weight global scale for the linears that read one input (q/k/v, gate/up), in the
    formats that have one.

    vLLM fuses them into one linear with one global scale (the largest stored, with a warning
    when they differ), so each gets the scale of their largest weight: the smallest of their
    own, as llm-compressor shares it. Linears alone in their sub-group keep their own.
    """
    out: dict[str, torch.Tensor] = {}
    for group in ctx.subgroups:
        members = [n for n in group if n in ctx.targets and number_format(ctx.targets[n][1].weights).has_global_scale]
        if len(members) < 2:
            continue
        weights = [ctx.targets[n][0].weight.data for n in members]
        fmt = number_format(ctx.targets[members[0]][1].weights)
        out.update({n: fmt.shared_global_scale([w.abs().amax() for w in weights], weights[0].dtype) for n in members})
    return out


def shared_global_scale(amaxes: list[torch.Tensor], dtype: torch.dtype, args: QuantArgs) -> torch.Tensor | None:
    """The global scale of ``args``' format for linears whose largest magnitudes are ``amaxes``
    (held in ``dtype``, the first one's): a streaming caller reads each weight once for its amax,
    never all at once. None for a format without one."""
    return number_format(args).shared_global_scale(amaxes, dtype)
