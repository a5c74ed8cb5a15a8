"""INT8 W8A8 GEMM: int8 weights and activations, int32 accumulation, output in x's dtype.

Reads the int-quantized tensors of docs/DESIGN.md as stored: ``weight`` int8 ``[N, K]``,
``weight_scale`` ``[N, 1]`` (or ``[1]``), ``input_scale`` ``[1]`` for static activations.
Activations are quantized symmetrically by the fused kernel of ``act_quant`` (per token,
dynamic; or per tensor), then ``y = float(xq @ wq.T) * sx[m] * sw[n] (+ bias)``: the int32
sum is exact, so the only rounding is the epilogue's. With no activation quantization
(weight-only) the codes are upcast to the activations' dtype, which holds them exactly.

Example:
    >>> y = int8_gemm(x, weight, weight_scale)                  # dynamic per token  # doctest: +SKIP
    >>> y = int8_gemm(x, weight, weight_scale, input_scale)     # static per tensor  # doctest: +SKIP
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantkit.kernels.act_quant import InputQuant, activation_codes, activation_scale, check_w8a8, grouped_tile, quantize_activations_reference, w8a8_linear
from quantkit.kernels.fp8_gemm import _AUTOTUNE_KEY, CONFIGS, INTERPRET_CONFIG, ScaledProblem, W8A8Kernel, scaled_gemm

# -- configs: the W8A8 tile shapes are fp8_gemm's (same operand widths, same tensor-core tiles)


# -- kernel -------------------------------------------------------------------------------
@triton.jit
def _int8_gemm_kernel(
    a_ptr, w_ptr, sa_ptr, sw_ptr, b_ptr, out_ptr,
    M, N, K, M_BUCKET,
    stride_am, stride_ak, stride_wn, stride_wk, stride_om, stride_on,
    A_QUANT: tl.constexpr, PER_TOKEN: tl.constexpr, PER_CHANNEL: tl.constexpr, HAS_BIAS: tl.constexpr,
    COMPUTE_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    if A_QUANT:
        acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.int32)
    else:
        acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak,
                    mask=mask_m[:, None] & mask_k[None, :], other=0)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=mask_k[:, None] & mask_n[None, :], other=0)
        if A_QUANT:
            acc += tl.dot(a, w)  # int8 x int8 -> int32: exact
        elif COMPUTE_F32:  # weight-only in the interpreter (no bf16 math) or with fp32 activations
            acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(a, w.to(a.dtype))

    res = acc.to(tl.float32)
    if A_QUANT:
        if PER_TOKEN:
            res = res * tl.load(sa_ptr + offs_m, mask=mask_m, other=0.0)[:, None]
        else:
            res = res * tl.load(sa_ptr)
    if PER_CHANNEL:
        res = res * tl.load(sw_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    else:
        res = res * tl.load(sw_ptr)
    if HAS_BIAS:
        res += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
             res.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


_tuned = triton.autotune(configs=CONFIGS, key=_AUTOTUNE_KEY)(_int8_gemm_kernel)


# -- wrapper ------------------------------------------------------------------------------
KERNEL = W8A8Kernel(_int8_gemm_kernel, _tuned, INTERPRET_CONFIG)


def int8_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
              input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
              input_quant: InputQuant | None = InputQuant(), config: dict | None = None) -> torch.Tensor:
    """``y = int8(x) @ W.T * scales (+ bias)`` for ``x`` ``[..., K]``; returns x's dtype.

    Activations: static with ``input_scale``, else dynamic (``InputQuant``'s strategy, per token
    by default). ``input_quant=None`` is the weight-only path.
    """
    sw = check_w8a8(x, weight, weight_scale, torch.int8, bias)
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if input_quant is not None:
        a, sa = activation_codes(x2, "int8", input_scale, input_quant)
        compute_f32 = False
    else:
        a, sa = x2, None
        compute_f32 = not x.is_cuda or x.dtype == torch.float32
    problem = ScaledProblem(a, weight, sa.reshape(-1) if sa is not None else None, sw, bias)
    return scaled_gemm(KERNEL, problem, x.dtype, compute_f32, config).reshape(*lead, n)


# -- torch reference ----------------------------------------------------------------------
def int8_gemm_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
                        input_quant: InputQuant | None = InputQuant()) -> torch.Tensor:
    """The same in torch: symmetric int8 activations, exact integer matmul (in fp64), fp32 scaling."""
    k = weight.shape[1]
    x2 = x.reshape(-1, k)
    if input_quant is not None:
        q, sa = quantize_activations_reference(x2, "int8", activation_scale(x2, "int8", input_scale, input_quant))
        y = (q.double() @ weight.double().t()).float() * sa.reshape(-1, 1)
    else:
        y = x2.float() @ weight.float().t()
    y = y * weight_scale.float().reshape(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


# -- QuantLinear backend ------------------------------------------------------------------
def int8_linear(x: torch.Tensor, layer) -> torch.Tensor:
    """Backend ``("int-quantized", "triton")``: ``fn(x, layer) -> Tensor``."""
    return w8a8_linear(int8_gemm, x, layer)


# -- benchmark entry ----------------------------------------------------------------------
def make_random(m: int, n: int, k: int, dtype=torch.bfloat16, device="cuda", seed: int = 0):
    """Random activations, an int8 weight and per-channel scales."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    sw = torch.rand(n, 1, generator=gen) * 1e-3 + 1e-4
    return x.to(device), w.to(device), sw.to(device)


def bench(m: int, n: int, k: int, dtype=torch.bfloat16, timer=None, device: str = "cuda") -> dict:
    """Time ``int8_gemm`` (activation quantization included) on CUDA; ``timer(fn) -> ms``."""
    x, w, sw = make_random(m, n, k, dtype, device)
    ms = (timer or triton.testing.do_bench)(lambda: int8_gemm(x, w, sw))
    nbytes = w.numel() + sw.numel() * 4 + (m * k + m * n) * x.element_size()
    return {"ms": ms, "flops": 2 * m * n * k, "bytes": nbytes}
