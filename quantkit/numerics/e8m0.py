"""E8M0: the power-of-two scale of the MX formats, stored as a biased exponent in a uint8.

A code ``e`` means ``2 ** (e - 127)``. The exponent chosen for a group follows
compressed-tensors' ``generate_mx_scales``: the group's absolute maximum is rounded to a
power of two (up when its mantissa would round up at the element format's mantissa
width), then lowered by the element format's largest exponent so the maximum lands in the
element range; codes are clamped to [0, 255].

Example:
    >>> e8m0_decode(e8m0_from_amax(torch.tensor([6.0, 7.0, 0.0]), elem_emax=2))
    tensor([1.0000e+00, 2.0000e+00, 5.8775e-39])
"""

from __future__ import annotations

import torch

E8M0_BIAS = 127
_F32_MANTISSA = 23


def e8m0_from_amax(amax: torch.Tensor, elem_emax: int, elem_mantissa: int = 1) -> torch.Tensor:
    """uint8 E8M0 codes for groups whose absolute maxima are ``amax``.

    ``elem_emax`` is ``floor(log2(max))`` of the element format (2 for FP4 E2M1, 8 for FP8
    E4M3). Computed on float32 bits: the same codes as compressed-tensors for float32 and
    bfloat16 weights (a bfloat16 value is a float32 whose low mantissa bits are zero).
    """
    bits = amax.float().abs().view(torch.int32)
    # adding half of the element format's last mantissa step carries into the exponent
    # exactly when the value rounds up to the next power of two
    carry = 1 << (_F32_MANTISSA - elem_mantissa - 1)
    exponent = ((bits + carry) >> _F32_MANTISSA) & 0xFF   # biased float32 exponent, 0 for zero
    return (exponent - elem_emax).clamp(0, 255).to(torch.uint8)


def e8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 ``2 ** (code - 127)`` (exact: every code is a float32, 2**-127 a subnormal)."""
    return torch.ldexp(torch.ones_like(codes, dtype=torch.float32), codes.to(torch.int32) - E8M0_BIAS)
