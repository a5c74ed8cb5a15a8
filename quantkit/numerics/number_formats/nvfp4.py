"""NVFP4: E2M1 in groups of 16, FP8 E4M3 group scales under a float32 global scale
(``448 * 6 / amax``, chosen first; linears that read one input share one: vLLM fuses them).

Example:
    >>> from quantkit.config.scheme import QuantArgs
    >>> fmt = number_format(QuantArgs(num_bits=4, type="float", group_size=16))
    >>> qp = fmt.scales(torch.randn(2, 32))
    >>> qp.scale.dtype, qp.global_scale.shape
    (torch.float8_e4m3fn, torch.Size([1]))
"""

from __future__ import annotations

import torch

from quantkit.config.scheme import QuantArgs
from quantkit.numerics.fp4_numerics import nvfp4_global_scale, nvfp4_group_scales
from quantkit.numerics.number_formats.base import number_format, register_format
from quantkit.numerics.number_formats.e2m1 import E2M1Format

__all__ = ["NVFP4Format", "number_format"]


@register_format("nvfp4")
class NVFP4Format(E2M1Format):
    named_args = QuantArgs(num_bits=4, type="float", group_size=16)
    has_global_scale = True

    def global_scale(self, w: torch.Tensor) -> torch.Tensor:
        return nvfp4_global_scale(w.abs().amax())

    def shared_global_scale(self, amaxes: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        return nvfp4_global_scale(torch.stack([a.to(dtype) for a in amaxes]).amax())

    def group_scales(self, amax: torch.Tensor, global_scale: torch.Tensor | None) -> torch.Tensor:
        return nvfp4_group_scales(amax, global_scale)
