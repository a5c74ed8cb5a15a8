"""E8M0 scales of the OCP MX formats: a power of two stored as a biased exponent in a uint8.

A group's scale is chosen as compressed-tensors chooses it (``generate_mx_scales``): the
group's absolute maximum is rounded to a power of two (rounding up only when its mantissa,
cut to the element format's mantissa width, would round past the next power), and divided by
``2**emax``, ``emax = floor(log2(element max))`` (8 for FP8 E4M3, 2 for FP4 E2M1), so the
largest magnitudes land near the top of the element range. The exponent is clamped to
``[0, 255]``: an all-zero group gets ``2**-127``, a maximum that rounds past float32's range
``2**128``.

Example:
    >>> scale_exponent(torch.tensor([448.0, 1.0, 0.0]), emax=8).tolist()
    [128, 119, 0]
    >>> exponent_to_scale(torch.tensor([127, 119], dtype=torch.uint8)).tolist()
    [1.0, 0.00390625]
"""

from __future__ import annotations

import torch

BIAS = 127
_F32_MANTISSA = 23


def scale_exponent(amax: torch.Tensor, emax: int, elem_mantissa: int = 1) -> torch.Tensor:
    """Biased E8M0 exponents (uint8) for groups whose absolute maxima are ``amax``."""
    bits = amax.float().view(torch.int32)
    # round to the nearest power of two at the element's mantissa width: add half of the
    # last kept mantissa bit, then drop the mantissa (amax >= 0, so the sign bit is clear)
    bits = bits + (1 << (_F32_MANTISSA - elem_mantissa - 1))
    biased = bits >> _F32_MANTISSA           # floor(log2) + 127; 0 for zero and subnormals
    biased = torch.where(biased >= 255, 255 + emax, biased)   # rounded to infinity: log2 is inf
    return (biased - emax).clamp(0, 255).to(torch.uint8)


def exponent_to_scale(exponent: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The scales ``2**(e - 127)`` of biased exponents, in ``dtype``."""
    return torch.pow(2.0, exponent.to(torch.float32) - BIAS).to(dtype)


def scale_to_exponent(scale: torch.Tensor) -> torch.Tensor:
    """The biased exponents (uint8) of power-of-two scales: ``exponent_to_scale``'s inverse."""
    return (BIAS + torch.floor(torch.log2(scale.float()))).clamp(0, 255).to(torch.uint8)
