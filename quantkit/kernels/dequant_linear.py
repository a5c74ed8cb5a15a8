"""Torch reference for the schemes without a dedicated kernel: FP8 blocks, MXFP8, and int
weights under 8 bits with 8-bit activations (W4AFP8, W4A8).

The weight is decoded from the checkpoint's tensors (``reference.dequantized_weight``), the
activations are quantized and decoded again the way the scheme says, per token or per token
group, before one dense matmul. The product of decoded values is what a serving kernel
computes exactly, up to the order of its float additions.

Activation scales: per token and per token group ``absmax / limit`` (fp8 448, int8 127), never
below vLLM's floors (fp8 ``1 / (448 * 512)``, int8 1e-10); MX groups of 32 take a power of two
chosen as for MX weights (``numerics/e8m0.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantkit.config.scheme import QuantArgs, fp4_kind
from quantkit.numerics.e8m0 import exponent_to_scale, scale_exponent
from quantkit.numerics.primitives import (FP8_DTYPE, FP8_EMAX, FP8_MAX, FP8_MIN_SCALE,
                                          quantize_dynamic_per_token)


def fake_quantize_activations(x: torch.Tensor, args: QuantArgs | None) -> torch.Tensor:
    """``x [..., hidden]`` quantized dynamically under ``args`` and decoded, in fp32."""
    if args is None:
        return x.float()
    if args.strategy == "token":
        q, scale = quantize_dynamic_per_token(x, args.type == "float")
        return q.float() * scale
    if args.strategy != "group" or args.type != "float":
        raise ValueError(f"input_activations: no reference for {args.type} {args.strategy} activations")
    g = x.float().unflatten(-1, (-1, args.group_size))
    amax = g.abs().amax(dim=-1, keepdim=True)
    if args.is_mx:
        scale = exponent_to_scale(scale_exponent(amax, FP8_EMAX))
    else:
        scale = (amax / FP8_MAX).clamp_min(FP8_MIN_SCALE)
    q = (g / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return (q.float() * scale).flatten(-2)


def dequant_linear(x: torch.Tensor, layer, weight: torch.Tensor) -> torch.Tensor:
    """``layer``'s output for ``x`` given its decoded ``weight``: decoded activations times the
    weight, in fp32."""
    xa = fake_quantize_activations(x, layer.scheme.input_activations)
    y = F.linear(xa, weight.float(), None if layer.bias is None else layer.bias.float())
    return y.to(x.dtype)


def needs_dequant_linear(layer) -> bool:
    """Whether the layer's scheme is one the W8A8 and W4A16 references do not compute."""
    w, a = layer.scheme.weights, layer.scheme.input_activations
    if fp4_kind(w) is not None:   # the FP4 formats have a reference of their own (reference._fp4_linear)
        return False
    if w.is_mx or w.strategy == "block":
        return True
    return a is not None and w.type == "int" and w.num_bits < 8


def reference_only(layer) -> bool:
    """Whether only the torch reference computes the layer's scheme (the Triton kernels take
    W4A16 / W8A16 at 2, 4 or 8 bits, W8A8 per channel or tensor, FP8 per channel or tensor)."""
    return needs_dequant_linear(layer) or (layer.format == "pack-quantized" and layer.num_bits not in (2, 4, 8))
