"""Torch reference backends: the numerics every other backend is tested against.

Weight-only formats dequantize the packed weight (``(q - zp) * scale``, as the checkpoint
defines it) and run a dense matmul. W8A8 formats quantize the activations exactly as a
serving kernel would (per token dynamically, or with the static per-tensor scale) and
multiply codes: int8 x int8 accumulated in int32, fp8 x fp8 accumulated in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantkit.formats.packing import unpack_int32
from quantkit.numerics.primitives import FP8_DTYPE, FP8_MAX, dequantize, quantize_dynamic_per_token
from quantkit.config.scheme import fp4_kind
from quantkit.formats.fp4_packed import FP4_FORMATS, unpack_fp4
from quantkit.kernels.dequant_linear import dequant_linear, needs_dequant_linear
from quantkit.numerics.e8m0 import exponent_to_scale
from quantkit.numerics.fp4_numerics import FP4Weight, dequantize_fp4, fake_quantize_fp4_input


def dequantized_weight(layer) -> torch.Tensor:
    """The layer's weight as floats, decoded from its packed tensors (cached per layer)."""
    cached = layer._cache.get("w")
    if cached is not None:
        return cached
    args = layer.scheme.weights
    if layer.format == "pack-quantized":
        shape = (layer.out_features, layer.in_features)
        q = unpack_int32(layer.weight_packed, layer.num_bits, shape, dim=1)
        zp = None
        if layer.weight_zero_point is not None:
            zp = unpack_int32(layer.weight_zero_point, layer.num_bits, (layer.out_features, layer.weight_scale.shape[-1]), dim=0)
    else:
        q, zp = layer.weight, layer.weight_zero_point
    scale = layer.weight_scale
    if args.is_mx:   # E8M0 exponents in the checkpoint
        scale = exponent_to_scale(scale, layer.dtype)
    w = dequantize(q, scale, zp, args, layer.weight_g_idx)
    if getattr(layer, "cache_dequantized", True):
        layer._cache["w"] = w
    return w


def w_only_linear(x: torch.Tensor, layer) -> torch.Tensor:
    if needs_dequant_linear(layer):
        return dequant_linear(x, layer, dequantized_weight(layer))
    w = dequantized_weight(layer).to(x.dtype)
    return F.linear(x, w, None if layer.bias is None else layer.bias.to(x.dtype))


def _act_codes(x2: torch.Tensor, layer, float_type: bool):
    """Per-token (dynamic) or per-tensor (static) symmetric activation codes and scales."""
    if layer.input_scale is None:
        return quantize_dynamic_per_token(x2, float_type)
    scale = layer.input_scale.float().reshape(1, 1)
    v = x2.float() / scale
    if float_type:
        return v.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale
    return torch.round(v).clamp(-128, 127).to(torch.int8), scale


def _weight_scale_row(layer) -> torch.Tensor:
    s = layer.weight_scale.float()
    return s.reshape(1, -1) if s.numel() > 1 else s.reshape(1, 1)


def int8_linear(x: torch.Tensor, layer) -> torch.Tensor:
    if needs_dequant_linear(layer):
        return dequant_linear(x, layer, dequantized_weight(layer))
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    xq, xs = _act_codes(x2, layer, float_type=False)
    if layer.input_scale is None and layer.scheme.input_activations is None:
        raise ValueError("int-quantized layer without activation quantization")
    acc = _int_matmul(xq, layer.weight)
    y = acc.float() * xs * _weight_scale_row(layer)
    if layer.bias is not None:
        y = y + layer.bias.float()
    return y.to(x.dtype).reshape(*shape[:-1], layer.out_features)


def _int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 [M, K] x int8 [N, K]^T -> int32 [M, N], exact."""
    try:
        return torch._int_mm(a, b.t())
    except RuntimeError:
        # Exact in float64 for any realistic K (|sum| < 2^53).
        return (a.double() @ b.double().t()).to(torch.int32)


def fp8_linear(x: torch.Tensor, layer) -> torch.Tensor:
    if needs_dequant_linear(layer):
        return dequant_linear(x, layer, dequantized_weight(layer))
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if layer.scheme.input_activations is None:  # FP8 weight-only
        w = dequantized_weight(layer).to(x.dtype)
        return F.linear(x, w, None if layer.bias is None else layer.bias.to(x.dtype))
    xq, xs = _act_codes(x2, layer, float_type=True)
    wf = layer._cache.get("wf")
    if wf is None:
        wf = layer._cache["wf"] = layer.weight.float()
    y = (xq.float() @ wf.t()) * xs * _weight_scale_row(layer)
    if layer.bias is not None:
        y = y + layer.bias.float()
    return y.to(x.dtype).reshape(*shape[:-1], layer.out_features)


def mxfp8_linear(x: torch.Tensor, layer) -> torch.Tensor:
    return dequant_linear(x, layer, dequantized_weight(layer))


# -- FP4 (NVFP4, MXFP4): emulated, as no CPU kernel computes in FP4 ---------------------------------
def _fp4_linear(x: torch.Tensor, layer) -> torch.Tensor:
    """The dequantized FP4 weight times the input, the input first through FP4 when the scheme
    quantizes activations (per-token groups, under NVFP4's calibrated global input scale)."""
    kind = fp4_kind(layer.scheme.weights)
    w = layer._cache.get("w")
    if w is None:
        w = dequantize_fp4(FP4Weight(unpack_fp4(layer.weight_packed), layer.weight_scale,
                                     layer.weight_global_scale), kind)
        if getattr(layer, "cache_dequantized", True):
            layer._cache["w"] = w
    if layer.scheme.input_activations is not None:
        x = fake_quantize_fp4_input(x, kind, layer.input_global_scale)
    return F.linear(x, w.to(x.dtype), None if layer.bias is None else layer.bias.to(x.dtype))


#: the reference's kernel for every checkpoint format (the package registers them as "torch")
KERNELS = {"pack-quantized": w_only_linear, "int-quantized": int8_linear, "float-quantized": fp8_linear,
           "mxfp8-quantized": mxfp8_linear, **{fmt: _fp4_linear for fmt in FP4_FORMATS}}
