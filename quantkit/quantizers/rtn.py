"""Round-to-nearest: each weight quantized on its own grid, no calibration data."""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.config.scheme import fp4_kind
from quantkit.numerics.fp4 import dequantize_fp4, quantize_fp4_weight
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
            if fp4_kind(args) is not None:
                out[name] = _rtn_fp4(w, fp4_kind(args))
                continue
            q, scale, zp = quantize_weight(w, args)
            stats = {"sqnr_db": round(sqnr_db(w, dequantize(q, scale, zp, args)), 3)}
            out[name] = QuantizedWeight(q, scale, zp, None, stats)
        return out


def _rtn_fp4(w, kind: str) -> QuantizedWeight:
    """FP4 on the format's own scales (min-max groups; NVFP4's global scale from the tensor)."""
    q = quantize_fp4_weight(w, kind)
    stats = {"sqnr_db": round(sqnr_db(w, dequantize_fp4(q, kind)), 3)}
    return QuantizedWeight(q.codes, q.scale, None, None, stats, q.global_scale)
