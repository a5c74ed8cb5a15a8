"""The FP4 checkpoint formats, "nvfp4-pack-quantized" and "mxfp4-pack-quantized".

One module's tensors, named and laid out as compressed-tensors' ``NVFP4PackedCompressor`` and
``MXFP4PackedCompressor`` write them:

- ``weight_packed`` uint8 ``[out, in // 2]``: two E2M1 codes a byte, the even column in the low
  nibble;
- ``weight_scale`` ``[out, in // G]``: float8_e4m3fn (NVFP4) or uint8 E8M0 exponents (MXFP4);
- ``weight_global_scale`` float32 ``[1]`` (NVFP4 only);
- ``input_global_scale`` float32 ``[1]`` for NVFP4 activations (the calibrated global scale
  their per-token group scales are chosen under); MXFP4 activations store nothing.

Example:
    >>> w = FP4Weight(torch.tensor([[1, 15]], dtype=torch.uint8), torch.ones(1, 1, dtype=torch.uint8))
    >>> pack_fp4(w.codes)
    tensor([[241]], dtype=torch.uint8)
"""

from __future__ import annotations

from typing import Mapping

import torch

from quantkit.config.scheme import QuantScheme, fp4_kind
from quantkit.numerics.fp4_numerics import FP4Weight, dequantize_fp4

FP4_FORMATS = ("nvfp4-pack-quantized", "mxfp4-pack-quantized")


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 ``[rows, cols // 2]`` from uint8 E2M1 codes ``[rows, cols]`` (``cols`` even)."""
    if codes.dtype != torch.uint8 or codes.ndim != 2 or codes.shape[1] % 2:
        raise ValueError(f"codes: expected a 2-D uint8 tensor with an even width, got {codes.dtype} "
                         f"{tuple(codes.shape)}")
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_fp4``: uint8 codes ``[rows, 2 * packed_cols]``."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed: expected uint8, got {packed.dtype}")
    return torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


def compress_fp4_module(w: FP4Weight, scheme: QuantScheme, bias: torch.Tensor | None = None,
                        input_global_scale: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Tensors of one FP4 Linear, named as the format names them (without the prefix)."""
    out = {"weight_packed": pack_fp4(w.codes), "weight_scale": w.scale.contiguous()}
    if fp4_kind(scheme.weights) == "nvfp4":
        # linears that share a global scale share the tensor: safetensors refuses shared storage
        out["weight_global_scale"] = w.global_scale.to(torch.float32, copy=True).reshape(1)
    if bias is not None:
        out["bias"] = bias.contiguous()
    if input_global_scale is not None:
        out["input_global_scale"] = input_global_scale.to(torch.float32, copy=True).reshape(1)
    return out


def fp4_weight(tensors: Mapping[str, torch.Tensor]) -> FP4Weight:
    """The ``FP4Weight`` of one module's tensors."""
    return FP4Weight(unpack_fp4(tensors["weight_packed"]), tensors["weight_scale"],
                     tensors.get("weight_global_scale"))


def decompress_fp4_module(tensors: Mapping[str, torch.Tensor], scheme: QuantScheme,
                          dtype: torch.dtype | None = None) -> torch.Tensor:
    """The dequantized weight of one FP4 module (float32 unless ``dtype``)."""
    return dequantize_fp4(fp4_weight(tensors), fp4_kind(scheme.weights), dtype or torch.float32)
