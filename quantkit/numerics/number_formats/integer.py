"""Integer grids: signed codes in ``[-2^(b-1), 2^(b-1) - 1]``, ``(q - zp) * scale``, 2-8 bits,
per tensor, channel, group (``g_idx`` for act-order groups) or block; the math is
``numerics/primitives.py``'s, so every path writes the bytes it always wrote.

Example:
    >>> from quantkit.config.scheme import QuantArgs
    >>> fmt = number_format(QuantArgs(num_bits=4, group_size=8, symmetric=False))
    >>> w = torch.randn(2, 16)
    >>> qp = fmt.scales(w)
    >>> qp.scale.shape, qp.zero_point.dtype
    (torch.Size([2, 2]), torch.int8)
"""

from __future__ import annotations

import torch

from quantkit.numerics.number_formats.base import (Clip, NumberFormat, QParams, number_format, register_format,
                                                   straight_through)
from quantkit.numerics.primitives import _expand, calculate_qparams, dequantize, quantize, reduce_minmax, weight_qparams

__all__ = ["IntFormat", "number_format"]


@register_format("int")
class IntFormat(NumberFormat):
    """Integer codes under a scale (and a zero point when asymmetric)."""

    affine = True
    stores_g_idx = True

    def range_scales(self, w: torch.Tensor, clip: Clip | None, global_scale: torch.Tensor | None,
                     g_idx: torch.Tensor | None) -> QParams:
        if clip is None:   # the observer's range: min-max, or the mse search
            return QParams(*weight_qparams(w, self.args, g_idx))
        lo, hi = clip.apply(*reduce_minmax(w, self.args, g_idx))
        return QParams(*calculate_qparams(lo, hi, self.args, dtype=w.dtype))

    def quantize(self, w: torch.Tensor, qp: QParams, g_idx: torch.Tensor | None = None,
                 offset: torch.Tensor | None = None) -> torch.Tensor:
        if offset is None:
            return quantize(w, qp.scale, qp.zero_point, self.args, g_idx)
        a = self.args
        v = w.float() / _expand(qp.scale, w.shape, a, g_idx).float() + offset.float()
        if qp.zero_point is not None:
            v = v + _expand(qp.zero_point, w.shape, a, g_idx).float()
        return torch.round(v).clamp(a.qmin, a.qmax).to(torch.int8)

    def dequantize(self, codes: torch.Tensor, qp: QParams, g_idx: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize(codes, qp.scale, qp.zero_point, self.args, g_idx, dtype)

    def fake_quantize(self, w: torch.Tensor, offset: torch.Tensor | None = None, clip: Clip | None = None,
                      global_scale: torch.Tensor | None = None) -> torch.Tensor:
        a, clip = self.args, clip or Clip()
        qp = self.range_scales(w.detach(), clip.detach(), None, None)
        lo, hi = clip.apply(*reduce_minmax(w.float(), a))
        lo, hi = lo.clamp(max=0.0), hi.clamp(min=0.0)
        if a.symmetric:
            soft = torch.maximum(-lo, hi) / ((a.qmax - a.qmin) / 2)
        else:
            soft = (hi - lo) / (a.qmax - a.qmin)
        s = _expand(straight_through(soft, qp.scale.float()), w.shape, a, None)
        v = w.float() / s
        if offset is not None:
            v = v + offset.float()
        z = None
        if qp.zero_point is not None:
            z_soft = a.qmin - lo / soft.clamp_min(torch.finfo(torch.float32).tiny)
            z = _expand(straight_through(z_soft, qp.zero_point.float()), w.shape, a, None)
            v = v + z
        c = straight_through(v, torch.round(v.detach())).clamp(a.qmin, a.qmax)
        return ((c - z) * s if z is not None else c * s).to(w.dtype)

    # GPTQ solves integer grids itself (quantizers/gptq/columns.py); the grid for symmetric ones:
    def step(self, qp: QParams) -> torch.Tensor:
        return qp.scale.float()

    def round_to_grid(self, v: torch.Tensor) -> torch.Tensor:
        return torch.round(v).clamp(self.args.qmin, self.args.qmax)

    def grid_values(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.float()
