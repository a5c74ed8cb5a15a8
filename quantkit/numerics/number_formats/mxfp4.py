"""MXFP4: E2M1 in groups of 32 under E8M0 power-of-two scales (``numerics/e8m0.py``).

Example:
    >>> from quantkit.config.scheme import QuantArgs
    >>> fmt = number_format(QuantArgs(num_bits=4, type="float", group_size=32))
    >>> fmt.scales(torch.randn(2, 64)).scale.dtype
    torch.uint8
"""

from __future__ import annotations

import torch

from quantkit.config.scheme import QuantArgs
from quantkit.numerics.e8m0 import scale_exponent
from quantkit.numerics.fp4_numerics import FP4_EMAX
from quantkit.numerics.number_formats.base import number_format, register_format
from quantkit.numerics.number_formats.e2m1 import E2M1Format

__all__ = ["MXFP4Format", "number_format"]


@register_format("mxfp4")
class MXFP4Format(E2M1Format):
    named_args = QuantArgs(num_bits=4, type="float", group_size=32)

    def group_scales(self, amax: torch.Tensor, global_scale: torch.Tensor | None) -> torch.Tensor:
        return scale_exponent(amax, FP4_EMAX)
