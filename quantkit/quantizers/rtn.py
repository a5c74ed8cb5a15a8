"""Round-to-nearest: each weight quantized on its own grid, no calibration data."""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.numerics.primitives import dequantize, quantize_weight, sqnr_db
from quantkit.steps.base import Algorithm, LayerContext, QuantizedWeight, register_algorithm


@register_algorithm("rtn")
@dataclass
class RTN(Algorithm):
    """Round to nearest on the scheme's grid (min-max, or MSE-clipped with ``observer: mse``)."""

    def quantize_layer(self, ctx: LayerContext) -> dict[str, QuantizedWeight]:
        out = {}
        for name, (module, scheme) in ctx.targets.items():
            w = module.weight.data
            args = scheme.weights
            q, scale, zp = quantize_weight(w, args)
            stats = {"sqnr_db": round(sqnr_db(w, dequantize(q, scale, zp, args)), 3)}
            out[name] = QuantizedWeight(q, scale, zp, None, stats)
        return out
