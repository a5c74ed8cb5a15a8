"""Fused activation quantization for the W8A8 kernels: one pass per token row.

Per-token dynamic: ``scale = max(absmax(row) / LIMIT, 1e-12)``; static per-tensor: the stored
``input_scale``. Codes are ``(x / scale)`` clamped to ``[-448, 448]`` and cast to float8_e4m3fn
(LIMIT 448), or rounded half-to-even and clamped to ``[-128, 127]`` in int8 (LIMIT 127.5,
the symmetric convention of ``quantkit.primitives.quantize_dynamic_per_token``).

Example:
    >>> codes, scale = quantize_activations(x, "int8")            # per token
    >>> codes, scale = quantize_activations(x, "fp8", input_scale) # static
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0
INT8_LIMIT = 127.5  # (qmax - qmin) / 2 for 8 bits
MIN_SCALE = 1e-12
BLOCK_COLS = 1024


@triton.jit
def _round_half_even(v):
    # no rint in the interpreter: floor(v + 0.5), moved down on exact ties with an odd result
    r = tl.floor(v + 0.5)
    half = r * 0.5
    odd = tl.floor(half) != half
    return tl.where(((r - v) == 0.5) & odd, r - 1.0, r)


@triton.jit
def _act_quant_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm,
    STATIC: tl.constexpr, INT8: tl.constexpr, LIMIT: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    if STATIC:
        scale = tl.load(s_ptr).to(tl.float32)
    else:
        amax = tl.zeros((BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.max(amax, axis=0) / LIMIT, 1e-12)
        tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        v = tl.math.div_rn(x, scale)  # IEEE division, as torch does (the default '/' is approximate)
        if INT8:
            v = tl.minimum(tl.maximum(_round_half_even(v), -128.0), 127.0)
        else:
            v = tl.minimum(tl.maximum(v, -448.0), 448.0)
        tl.store(q_ptr + row * stride_qm + offs, v.to(q_ptr.dtype.element_ty), mask=offs < K)


def quantize_activations(x: torch.Tensor, kind: str, input_scale: torch.Tensor | None = None):
    """Codes ``[M, K]`` and fp32 scales (``[M, 1]`` per token, ``[1]`` static) of ``x`` ``[M, K]``.

    ``kind`` is ``"fp8"`` or ``"int8"``. Under the interpreter the fp32->fp8 cast rounds a few
    percent of values to a neighbouring code (FACTS.md); on a GPU it rounds to nearest even.
    """
    if kind not in ("fp8", "int8"):
        raise ValueError(f"kind: expected 'fp8' or 'int8', got {kind!r}")
    if x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(f"x: expected a 2-D float tensor [M, K], got {x.dtype} {list(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    m, k = x.shape
    int8 = kind == "int8"
    codes = torch.empty((m, k), dtype=torch.int8 if int8 else torch.float8_e4m3fn, device=x.device)
    if input_scale is not None:
        if input_scale.numel() != 1:
            raise ValueError(f"input_scale: expected one per-tensor scale, got shape {list(input_scale.shape)}")
        scale = input_scale.reshape(1).to(device=x.device, dtype=torch.float32)
    else:
        scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
    if m == 0:
        return codes, scale
    if x.dtype == torch.bfloat16 and not x.is_cuda:
        x = x.float()  # interpreter: bf16 loads are fine but keep all math in fp32 (FACTS.md)
    _act_quant_kernel[(m,)](x, codes, scale, k, x.stride(0), codes.stride(0),
                            STATIC=input_scale is not None, INT8=int8,
                            LIMIT=INT8_LIMIT if int8 else FP8_MAX, BLOCK=min(BLOCK_COLS, triton.next_power_of_2(k)))
    return codes, scale


def quantize_activations_reference(x: torch.Tensor, kind: str, input_scale: torch.Tensor | None = None):
    """The same in torch (matches ``quantkit.primitives.quantize_dynamic_per_token``)."""
    xf = x.float()
    if input_scale is not None:
        scale = input_scale.reshape(1).float()
    else:
        limit = INT8_LIMIT if kind == "int8" else FP8_MAX
        scale = torch.clamp(xf.abs().amax(dim=-1, keepdim=True) / limit, min=MIN_SCALE)
    v = xf / scale
    if kind == "int8":
        return torch.round(v).clamp(-128, 127).to(torch.int8), scale
    return v.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale
