"""FP4 E2M1 numbers and their two scaled formats, NVFP4 and MXFP4: pure functions over tensors.

An E2M1 code is a uint8 nibble as the packed format stores it: bit 3 the sign, bits 0-2 the
index of the magnitude in ``E2M1_GRID``. Rounding goes to the nearest grid point; a value
halfway between two takes the one with the even mantissa (0.25 -> 0, 0.75 -> 1, 1.25 -> 1,
1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), and the sign bit is set for every value below zero
(-0.1 becomes -0, code 8; -0.0 itself is code 0), as compressed-tensors' ``cast_to_fp4`` and
``pack_fp4_to_uint8`` code them on the CPU.

- NVFP4: groups of 16 along the input dimension. A float32 global scale per tensor,
  ``448 * 6 / amax``, is chosen first; each group's scale is ``global * (group_amax / 6)``
  rounded to FP8 E4M3 (a scale that rounds to 0 becomes 0.125, compressed-tensors' floor).
  A value is coded as ``x / (scale / global)`` and decoded as ``value * (scale / global)``.
- MXFP4: groups of 32 with an E8M0 power-of-two scale (``numerics/e8m0.py``), no global scale.

Example:
    >>> w = torch.randn(8, 32)
    >>> q = quantize_fp4_weight(w, "nvfp4")
    >>> bool((dequantize_fp4(q, "nvfp4") - w).abs().max() < w.abs().max() / 4)
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from quantkit.numerics.e8m0 import exponent_to_scale, scale_exponent

FP4Kind = Literal["nvfp4", "mxfp4"]
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4_MAX = 6.0
FP4_EMAX = 2                         # floor(log2(6)): the E8M0 offset of FP4 elements
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
NVFP4_ZERO_SCALE = 0.125             # compressed-tensors' replacement for an FP8 scale of 0
GROUP_SIZE: dict[str, int] = {"nvfp4": 16, "mxfp4": 32}
# Upper bounds of each magnitude bucket: strict (>) where the tie goes down, inclusive (>=)
# where it goes up to the even mantissa.
_UP_STRICT = (0.25, 1.25, 2.5, 5.0)
_UP_INCLUSIVE = (0.75, 1.75, 3.5)


@dataclass(frozen=True)
class FP4Weight:
    """An FP4 weight as the checkpoint stores it.

    ``codes`` uint8 ``[out, in]`` (one nibble each); ``scale`` ``[out, in // G]``: float8_e4m3fn
    for NVFP4, uint8 E8M0 codes for MXFP4; ``global_scale`` float32 ``[1]`` (NVFP4 only).
    """

    codes: torch.Tensor
    scale: torch.Tensor
    global_scale: torch.Tensor | None = None


# -- the E2M1 grid --------------------------------------------------------------------------
def round_to_e2m1(v: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes of ``v`` (clamped to [-6, 6], nearest grid point, ties to even)."""
    v = v.float().clamp(-FP4_MAX, FP4_MAX)
    a = v.abs()
    idx = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for t in _UP_STRICT:
        idx += a > t
    for t in _UP_INCLUSIVE:
        idx += a >= t
    return idx | ((v < 0).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of uint8 E2M1 codes."""
    grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=codes.device)
    mag = grid[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -mag, mag)


# -- scales -----------------------------------------------------------------------------------
def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """float32 ``[1]``: ``448 * 6 / amax``, so the largest group scale uses FP8's whole range.

    Computed in ``amax``'s dtype, then held as float32 (a bfloat16 weight's global scale has
    bfloat16 precision), and an all-zero or non-finite tensor gets 1: compressed-tensors'
    ``generate_gparam``.
    """
    amax = amax.abs().reshape(1).clamp_min(torch.finfo(amax.dtype).tiny)
    gs = torch.nan_to_num(FP8_MAX * FP4_MAX / amax, nan=1.0, posinf=1.0, neginf=1.0)
    return gs.float()


def nvfp4_group_scales(group_amax: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn group scales from the groups' absolute maxima (in the tensor's dtype)."""
    # amax / 6 first, in the tensor's dtype, then times the float32 global scale: the order
    # compressed-tensors' calculate_qparams computes in (the FP8 rounding sees the same float)
    s = global_scale.float() * (group_amax / FP4_MAX)
    s = s.float().clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float()
    return torch.where(s == 0, torch.full_like(s, NVFP4_ZERO_SCALE), s).to(FP8_DTYPE)


def group_amax(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """Absolute maximum of each contiguous group of ``group_size`` along the last dimension."""
    return x.unflatten(-1, (x.shape[-1] // group_size, group_size)).abs().amax(dim=-1)


def effective_scale(scale: torch.Tensor, global_scale: torch.Tensor | None, kind: FP4Kind) -> torch.Tensor:
    """The float32 step of each group: ``scale / global`` (NVFP4) or ``2 ** e`` (MXFP4)."""
    if kind == "mxfp4":
        return exponent_to_scale(scale)
    return scale.float() / global_scale.float()


def _expand(s: torch.Tensor, group_size: int) -> torch.Tensor:
    return s.repeat_interleave(group_size, dim=-1)


# -- weights ----------------------------------------------------------------------------------
def fp4_scales(w: torch.Tensor, kind: FP4Kind, global_scale: torch.Tensor | None = None):
    """``(scale, global_scale)`` for a weight ``[out, in]``: min-max group scales.

    NVFP4's global scale comes from the whole tensor unless given (GPTQ fixes it before it
    chooses any group scale).
    """
    amax = group_amax(w, GROUP_SIZE[kind])
    if kind == "mxfp4":
        return scale_exponent(amax, FP4_EMAX), None
    if global_scale is None:
        global_scale = nvfp4_global_scale(w.abs().amax())
    return nvfp4_group_scales(amax, global_scale), global_scale


def quantize_fp4(x: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | None,
                 kind: FP4Kind) -> torch.Tensor:
    """uint8 E2M1 codes of ``x`` ``[..., in]`` under per-group scales ``[..., in // G]``."""
    step = _expand(effective_scale(scale, global_scale, kind), GROUP_SIZE[kind])
    return round_to_e2m1(x.float() / step)


def dequantize_fp4(w: FP4Weight, kind: FP4Kind, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight an FP4 checkpoint computes with: ``value * step`` in float32, cast to ``dtype``."""
    step = _expand(effective_scale(w.scale, w.global_scale, kind), GROUP_SIZE[kind])
    return (e2m1_values(w.codes) * step).to(dtype)


def quantize_fp4_weight(w: torch.Tensor, kind: FP4Kind, global_scale: torch.Tensor | None = None) -> FP4Weight:
    """Round-to-nearest FP4 of a weight ``[out, in]`` (``in`` a multiple of the group size)."""
    scale, gs = fp4_scales(w, kind, global_scale)
    return FP4Weight(quantize_fp4(w, scale, gs, kind), scale, gs)


# -- activations ------------------------------------------------------------------------------
def fake_quantize_fp4_input(x: torch.Tensor, kind: FP4Kind, global_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Activations ``[..., in]`` through FP4 and back, with dynamic per-group scales.

    NVFP4 takes the static global input scale from calibration (``input_global_scale``) and
    chooses FP8 group scales under it per token group; MXFP4 chooses E8M0 scales per group.
    Returned in ``x``'s dtype.
    """
    amax = group_amax(x, GROUP_SIZE[kind])
    if kind == "mxfp4":
        scale = scale_exponent(amax, FP4_EMAX)
    else:
        scale = nvfp4_group_scales(amax, global_scale)
    step = _expand(effective_scale(scale, global_scale, kind), GROUP_SIZE[kind])
    return (e2m1_values(round_to_e2m1(x.float() / step)) * step).to(x.dtype)
