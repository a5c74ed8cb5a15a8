"""Fused activation quantization for the W8A8 kernels: one pass per token row.

Per-token dynamic: ``scale = max(absmax(row) / LIMIT, MIN_SCALE)``; static per-tensor: the
stored ``input_scale``. Codes are ``(x / scale)`` clamped to ``[-448, 448]`` and cast to
float8_e4m3fn, or rounded half-to-even and clamped to ``[-128, 127]`` in int8. LIMIT and
MIN_SCALE are vLLM's serving constants, as in the torch reference backend (``reference.py``):
int8 127 and 1e-10, fp8 448 and 1 / (448 * 512).

Example:
    >>> codes, scale = quantize_activations(x, "int8")            # per token  # doctest: +SKIP
    >>> codes, scale = quantize_activations(x, "fp8", input_scale) # static  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0
LIMIT = {"int8": 127.0, "fp8": FP8_MAX}
MIN_SCALE = {"int8": 1e-10, "fp8": 1.0 / (FP8_MAX * 512.0)}
BLOCK_COLS = 1024


# The kernels use Triton builtins only, no standard-library helpers (tl.cdiv, tl.zeros,
# tl.max, ...): those are @jit functions made when triton is imported, so if anything imported
# triton before TRITON_INTERPRET=1 was set (transformers does), they cannot run in the
# interpreter. Our own @jit functions are made at first use and follow the variable.
@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Output tile (row, column) of GEMM program ``pid``, in grouped order: GROUP_M row tiles
    run next to each other on each weight column tile, so that tile stays in L2."""
    num_m = (M + BLOCK_M - 1) // BLOCK_M
    num_n = (N + BLOCK_N - 1) // BLOCK_N
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _round_half_even(v):
    # no rint in the interpreter: floor(v + 0.5), moved down on exact ties with an odd result
    r = tl.floor(v + 0.5)
    half = r * 0.5
    odd = tl.floor(half) != half
    return tl.where(((r - v) == 0.5) & odd, r - 1.0, r)


@triton.jit
def _round_to_e4m3(v):
    # Round |v| <= 448 to the nearest E4M3 value in fp32, so that the cast below is exact.
    # The interpreter's fp32->fp8 cast is wrong for ~3% of values (docs/PLATFORM.md): measured, it drops
    # the carry when the mantissa rounds up into the next binade (127.9 becomes 64). On a GPU
    # this gives what the native round-to-nearest-even cast gives.
    bits = v.to(tl.int32, bitcast=True)
    # normal range: keep 3 of 23 mantissa bits, round to nearest even on the bit pattern
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)  # ~0xFFFFF
    # subnormal range (|v| < 2^-6): fixed step 2^-9, on |v| so that the sign (and -0) survives
    a = tl.abs(v)
    sub = _round_half_even(a * 512.0) * 0.001953125
    sub = tl.where(bits < 0, -sub, sub)
    return tl.where(a < 0.015625, sub, normal)


@triton.jit
def _act_quant_kernel(
    x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm,
    STATIC: tl.constexpr, INT8: tl.constexpr, LIMIT: tl.constexpr, MIN_SCALE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_xm
    if STATIC:
        scale = tl.load(s_ptr).to(tl.float32)
    else:
        amax = tl.full((BLOCK,), 0, tl.float32)
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(x))
        scale = tl.maximum(tl.math.div_rn(tl.reduce(amax, 0, _max_combine), tl.full((), LIMIT, tl.float32)), MIN_SCALE)
        tl.store(s_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        # cast at once: bf16 arithmetic is broken in the interpreter (docs/PLATFORM.md)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        v = tl.math.div_rn(x, scale)  # IEEE division, as torch does (the default '/' is approximate)
        if INT8:
            v = tl.minimum(tl.maximum(_round_half_even(v), -128.0), 127.0)
        else:
            v = _round_to_e4m3(tl.minimum(tl.maximum(v, -448.0), 448.0))
        tl.store(q_ptr + row * stride_qm + offs, v.to(q_ptr.dtype.element_ty), mask=offs < K)


def quantize_activations(x: torch.Tensor, kind: str, input_scale: torch.Tensor | None = None):
    """Codes ``[M, K]`` and fp32 scales (``[M, 1]`` per token, ``[1]`` static) of ``x`` ``[M, K]``.

    ``kind`` is ``"fp8"`` or ``"int8"``. FP8 codes are rounded to nearest even in fp32 before
    the cast, which sidesteps the interpreter's faulty fp32->fp8 cast (docs/PLATFORM.md).
    """
    if kind not in ("fp8", "int8"):
        raise ValueError(f"kind: expected 'fp8' or 'int8', got {kind!r}")
    if x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError(f"x: expected a 2-D float tensor [M, K], got {x.dtype} {list(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    check_runnable(x, _act_quant_kernel)
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
    _act_quant_kernel[(m,)](x, codes, scale, k, x.stride(0), codes.stride(0),
                            STATIC=input_scale is not None, INT8=int8, LIMIT=LIMIT[kind], MIN_SCALE=MIN_SCALE[kind],
                            BLOCK=min(BLOCK_COLS, triton.next_power_of_2(k)))
    return codes, scale


def quantize_activations_reference(x: torch.Tensor, kind: str, input_scale: torch.Tensor | None = None):
    """The same in torch (the torch reference backend's activation quantization)."""
    xf = x.float()
    if input_scale is not None:
        scale = input_scale.reshape(1).float()
    else:
        scale = torch.clamp(xf.abs().amax(dim=-1, keepdim=True) / LIMIT[kind], min=MIN_SCALE[kind])
    v = xf / scale
    if kind == "int8":
        return torch.round(v).clamp(-128, 127).to(torch.int8), scale
    return v.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


# -- shared by the wrappers -------------------------------------------------------------------
def check_runnable(x: torch.Tensor, kernel) -> None:
    """CPU tensors run only in the interpreter, which is chosen when ``@triton.jit`` runs."""
    if x.is_cuda:
        return
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(kernel, InterpretedFunction):
        raise ValueError(f"x: on {x.device}, but the Triton kernels need CUDA tensors, or TRITON_INTERPRET=1 "
                         "set before quantkit.kernels is first imported (use backend='torch' on the CPU)")


def check_w8a8(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_dtype: torch.dtype,
               bias: torch.Tensor | None) -> torch.Tensor:
    """Check shapes and dtypes; return the weight scale as fp32 ``[1]`` or ``[N]``."""
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x: expected float16, bfloat16 or float32 activations, got {x.dtype}")
    if weight.dtype != weight_dtype or weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D {weight_dtype} tensor [N, K], got {weight.dtype} {list(weight.shape)}")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x: last dimension {x.shape[-1]} does not match the weight's in_features={k}")
    if x.device != weight.device:
        raise ValueError(f"x: on {x.device} but weight is on {weight.device}")
    if weight_scale.numel() not in (1, n) or (weight_scale.numel() == n and weight_scale.shape[0] != n):
        raise ValueError(f"weight_scale: expected [1] (tensor) or [{n}, 1] (channel), got {list(weight_scale.shape)}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias: expected [{n}], got {list(bias.shape)}")
    return weight_scale.reshape(-1).float()


@dataclass(frozen=True)
class InputQuant:
    """How a W8A8 GEMM quantizes its activations (``None`` in its place: weight-only, no quantization).

    ``dynamic=None`` is dynamic exactly when no ``input_scale`` is given. Dynamic activations
    take their scales per token (``strategy="token"``, the fused kernel) or from the whole
    tensor's absmax (``"tensor"``); static ones use the stored ``input_scale``.
    """

    dynamic: bool | None = None
    strategy: str = "token"


def activation_scale(x2: torch.Tensor, kind: str, input_scale: torch.Tensor | None,
                     quant: InputQuant) -> torch.Tensor | None:
    """The one scale ``[1]`` the activations ``x2`` share under ``quant``, or None for per-token scales."""
    dynamic = input_scale is None if quant.dynamic is None else quant.dynamic
    if dynamic and quant.strategy == "tensor":
        return torch.clamp(x2.abs().amax().float() / LIMIT[kind], min=MIN_SCALE[kind]).reshape(1)
    if dynamic and quant.strategy != "token":
        raise ValueError(f"input_strategy: dynamic activations support 'token' or 'tensor', got {quant.strategy!r}")
    if not dynamic and input_scale is None:
        raise ValueError("input_scale: static activation quantization needs a stored input_scale")
    return input_scale


def activation_codes(x2: torch.Tensor, kind: str, input_scale: torch.Tensor | None, quant: InputQuant):
    """Codes and fp32 scales (``[M, 1]`` or ``[1]``) for the 2-D activations of a W8A8 layer."""
    return quantize_activations(x2, kind, activation_scale(x2, kind, input_scale, quant))


def w8a8_linear(gemm, x: torch.Tensor, layer) -> torch.Tensor:
    """Run a W8A8 GEMM (``fp8_gemm`` or ``int8_gemm``) for a QuantLinear: its scales, its
    static or dynamic activation scheme, its bias."""
    if getattr(layer, "weight_zero_point", None) is not None:
        raise ValueError("weight_zero_point: the Triton W8A8 kernels take symmetric weights only (use backend='torch')")
    dynamic = bool(getattr(layer, "input_dynamic", False))
    input_scale = getattr(layer, "input_scale", None)
    quant = InputQuant(dynamic, getattr(layer, "input_strategy", None) or "token")
    return gemm(x, layer.weight, layer.weight_scale, None if dynamic else input_scale,
                getattr(layer, "bias", None), input_quant=quant if dynamic or input_scale is not None else None)
