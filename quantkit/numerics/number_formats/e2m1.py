"""What NVFP4 and MXFP4 share: E2M1 elements (``numerics/fp4_numerics.py``) in contiguous groups along
the input dimension, one scale per group, no ``g_idx``. The two differ in their scales only.
"""

from __future__ import annotations

import torch

from quantkit.numerics.fp4_numerics import (FP4_MAX, FP4Weight, dequantize_fp4, e2m1_values, effective_scale, fp4_scales,
                                   quantize_fp4, round_to_e2m1)
from quantkit.numerics.number_formats.base import Clip, NumberFormat, QParams, straight_through


class E2M1Format(NumberFormat):
    """E2M1 codes (uint8 nibbles) under per-group scales; subclasses choose the scale encoding."""

    def group_scales(self, amax: torch.Tensor, global_scale: torch.Tensor | None) -> torch.Tensor:
        """The stored scales of groups whose (clipped) absolute maxima are ``amax``."""
        raise NotImplementedError

    def range_scales(self, w: torch.Tensor, clip: Clip | None, global_scale: torch.Tensor | None,
                     g_idx: torch.Tensor | None) -> QParams:
        if g_idx is not None:
            raise ValueError(f"{self.name}: groups are contiguous (no g_idx)")
        if self.has_global_scale and global_scale is None:
            global_scale = self.global_scale(w)
        if clip is None:
            scale, gs = fp4_scales(w, self.name, global_scale)
            return QParams(scale, None, gs)
        wg = w.unflatten(-1, (w.shape[-1] // self.group_size, self.group_size))
        lo, hi = clip.apply(wg.amin(-1), wg.amax(-1))
        amax = torch.maximum(-lo, hi).clamp_min(0)
        return QParams(self.group_scales(amax, global_scale), None, global_scale)

    def quantize(self, w: torch.Tensor, qp: QParams, g_idx: torch.Tensor | None = None,
                 offset: torch.Tensor | None = None) -> torch.Tensor:
        if offset is None:
            return quantize_fp4(w, qp.scale, qp.global_scale, self.name)
        step = self.step(qp).repeat_interleave(self.group_size, dim=-1)
        return round_to_e2m1(w.float() / step + offset.float())

    def dequantize(self, codes: torch.Tensor, qp: QParams, g_idx: torch.Tensor | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        return dequantize_fp4(FP4Weight(codes, qp.scale, qp.global_scale), self.name, dtype or torch.float32)

    def fake_quantize(self, w: torch.Tensor, offset: torch.Tensor | None = None, clip: Clip | None = None,
                      global_scale: torch.Tensor | None = None) -> torch.Tensor:
        clip = clip or Clip()
        qp = self.range_scales(w.detach(), clip.detach(), global_scale, None)
        wg = w.float().unflatten(-1, (w.shape[-1] // self.group_size, self.group_size))
        lo, hi = clip.apply(wg.amin(-1), wg.amax(-1))
        soft = torch.maximum(-lo, hi).clamp_min(0) / FP4_MAX    # the step before its encoding rounds it
        step = straight_through(soft, self.step(qp)).repeat_interleave(self.group_size, dim=-1)
        v = w.float() / step
        if offset is not None:
            v = v + offset.float()
        c = straight_through(v, e2m1_values(round_to_e2m1(v.detach())))
        return (c * step).to(w.dtype)

    def step(self, qp: QParams) -> torch.Tensor:
        return effective_scale(qp.scale, qp.global_scale, self.name)

    def round_to_grid(self, v: torch.Tensor) -> torch.Tensor:
        return round_to_e2m1(v)

    def grid_values(self, codes: torch.Tensor) -> torch.Tensor:
        return e2m1_values(codes)
