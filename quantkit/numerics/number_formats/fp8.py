"""FP8 E4M3 weights: per tensor, channel or block scales, and MXFP8's E8M0 groups of 32
(``numerics/primitives.py``, ``numerics/e8m0.py``). GPTQ's column loop does not round to them.

Example:
    >>> from quantkit.config.scheme import QuantArgs
    >>> fmt = number_format(QuantArgs(num_bits=8, type="float", strategy="channel"))
    >>> fmt.quantize(torch.randn(2, 4), fmt.scales(torch.randn(2, 4))).dtype
    torch.float8_e4m3fn
"""

from __future__ import annotations

import torch

from quantkit.numerics.number_formats.base import (Clip, NumberFormat, QParams, number_format, register_format,
                                                   straight_through)
from quantkit.numerics.primitives import (FP8_DTYPE, FP8_MAX, _expand, calculate_qparams, dequantize, quantize,
                                          reduce_minmax, weight_qparams)

__all__ = ["FP8Format", "number_format"]


@register_format("fp8")
class FP8Format(NumberFormat):
    """float8_e4m3fn codes under float (or E8M0) scales."""

    solvable = False

    def range_scales(self, w: torch.Tensor, clip: Clip | None, global_scale: torch.Tensor | None,
                     g_idx: torch.Tensor | None) -> QParams:
        if clip is None:
            return QParams(*weight_qparams(w, self.args, g_idx))
        lo, hi = clip.apply(*reduce_minmax(w, self.args, g_idx))
        return QParams(*calculate_qparams(lo, hi, self.args, dtype=w.dtype))

    def quantize(self, w: torch.Tensor, qp: QParams, g_idx: torch.Tensor | None = None,
                 offset: torch.Tensor | None = None) -> torch.Tensor:
        if offset is not None:
            raise ValueError("fp8: no rounding offset (the cast rounds)")
        return quantize(w, qp.scale, None, self.args, g_idx)

    def dequantize(self, codes: torch.Tensor, qp: QParams, g_idx: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize(codes, qp.scale, None, self.args, g_idx, dtype)

    def fake_quantize(self, w: torch.Tensor, offset: torch.Tensor | None = None, clip: Clip | None = None,
                      global_scale: torch.Tensor | None = None) -> torch.Tensor:
        if offset is not None:
            raise ValueError("fp8: no rounding offset (the cast rounds)")
        a, clip = self.args, clip or Clip()
        qp = self.range_scales(w.detach(), clip.detach(), None, None)
        lo, hi = clip.apply(*reduce_minmax(w.float(), a))
        soft = torch.maximum(-lo.clamp(max=0.0), hi.clamp(min=0.0)) / FP8_MAX
        s = _expand(straight_through(soft, qp.scale.float()), w.shape, a, None)
        v = w.float() / s
        c = straight_through(v, v.detach().clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float())
        return (c * s).to(w.dtype)
