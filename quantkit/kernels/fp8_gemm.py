"""FP8 W8A8 GEMM: E4M3 weights and activations, fp32 accumulation, output in x's dtype.

Reads the float-quantized tensors of docs/DESIGN.md as stored: ``weight`` float8_e4m3fn
``[N, K]`` (K-major, what the fp8 tensor cores want for the second operand), ``weight_scale``
``[1]`` or ``[N, 1]``, ``input_scale`` ``[1]`` for static activations. Activations are
quantized by the fused kernel of ``act_quant`` (per token, dynamic; or per tensor), then
``y = (xq @ wq.T) * sx[m] * sw[n] (+ bias)``. With no activation quantization at all
(weight-only FP8) the kernel multiplies ``x`` with the upcast weight instead.

Example:
    >>> y = fp8_gemm(x, weight, weight_scale)                  # dynamic per token  # doctest: +SKIP
    >>> y = fp8_gemm(x, weight, weight_scale, input_scale)     # static per tensor  # doctest: +SKIP
    >>> y = fp8_gemm(x, weight, weight_scale, input_quant=InputQuant(strategy="tensor"))  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from quantkit.kernels.act_quant import FP8_MAX, InputQuant, activation_codes, activation_scale, check_runnable, check_w8a8, grouped_tile, quantize_activations_reference, w8a8_linear

# -- configs ------------------------------------------------------------------------------
_CONFIGS = [  # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages)
    (16, 64, 256, 1, 4, 4), (16, 128, 128, 1, 4, 4), (32, 128, 128, 1, 4, 4), (64, 128, 128, 8, 4, 4),
    (128, 128, 128, 8, 8, 3), (128, 256, 128, 8, 8, 3), (256, 128, 128, 8, 8, 3), (64, 256, 128, 8, 4, 4),
]
CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": g}, num_warps=w, num_stages=s)
           for m, n, k, g, w, s in _CONFIGS]
# the interpreter's fixed config; also for fp32 activations on a GPU (slow IEEE fp32 dots:
# one config compiles in minutes, autotuning all of them would take far longer)
INTERPRET_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 4}
_AUTOTUNE_KEY = ["M_BUCKET", "N", "K", "A_QUANT", "PER_TOKEN", "PER_CHANNEL"]


# -- kernel -------------------------------------------------------------------------------
@triton.jit
def _fp8_gemm_kernel(
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
    acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                    mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if COMPUTE_F32:  # interpreter (no fp8/bf16 dot there) or fp32 activations; fp8 -> fp32 is exact
            acc += tl.dot(a.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        elif A_QUANT:
            acc += tl.dot(a, w)
        else:  # weight-only: upcast the codes to the activations' dtype (exact for E4M3 in fp16/bf16)
            acc += tl.dot(a, w.to(a.dtype))

    if PER_CHANNEL:
        sw = tl.load(sw_ptr + offs_n, mask=mask_n, other=0.0)
    else:
        sw = tl.load(sw_ptr)
    if A_QUANT:
        if PER_TOKEN:
            sa = tl.load(sa_ptr + offs_m, mask=mask_m, other=0.0)
            acc = acc * sa[:, None]
        else:
            acc = acc * tl.load(sa_ptr)
    if PER_CHANNEL:
        acc = acc * sw[None, :]
    else:
        acc = acc * sw
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on,
             acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


_tuned = triton.autotune(configs=CONFIGS, key=_AUTOTUNE_KEY)(_fp8_gemm_kernel)


# -- wrapper ------------------------------------------------------------------------------
@dataclass(frozen=True)
class W8A8Kernel:
    """A W8A8 kernel as launched: the plain ``@triton.jit`` function, its autotuned wrapper, and
    the fixed config the interpreter (and fp32 activations) use instead of autotuning."""

    jit: object
    tuned: object
    interpret_config: dict


@dataclass(frozen=True)
class ScaledProblem:
    """``y = (a @ weight.T) * sa[m] * sw[n] (+ bias)`` on 2-D ``a`` ``[M, K]`` and ``weight`` ``[N, K]``.

    ``a`` holds activation codes with their fp32 scales ``sa`` (``[M]`` or ``[1]``), or floats
    with ``sa=None`` (weight-only); ``sw`` is the weight's fp32 scale, ``[N]`` or ``[1]``.
    """

    a: torch.Tensor
    weight: torch.Tensor
    sa: torch.Tensor | None
    sw: torch.Tensor
    bias: torch.Tensor | None = None


KERNEL = W8A8Kernel(_fp8_gemm_kernel, _tuned, INTERPRET_CONFIG)


def scaled_gemm(kernel: W8A8Kernel, p: ScaledProblem, out_dtype: torch.dtype, compute_f32: bool,
                config: dict | None = None) -> torch.Tensor:
    """Launch a W8A8 kernel on the problem ``p`` -> ``[M, N]`` in ``out_dtype``.

    ``config`` pins the launch (tile sizes, ``num_warps``, ``num_stages``); otherwise the
    autotuned kernel runs on a GPU, ``kernel.interpret_config`` in the interpreter.
    """
    a, weight, sa, sw, bias = p.a, p.weight, p.sa, p.sw, p.bias
    check_runnable(a, kernel.jit)
    m, k = a.shape
    n = weight.shape[0]
    interpreted = not a.is_cuda
    if interpreted and out_dtype == torch.bfloat16:
        store_dtype = torch.float32  # the interpreter truncates fp32 -> bf16 (docs/PLATFORM.md): cast in torch
    else:
        store_dtype = out_dtype
    out = torch.empty((m, n), dtype=store_dtype, device=a.device)
    if m == 0:
        return out.to(out_dtype)
    if weight.stride(-1) != 1:
        raise ValueError(f"weight: expected K-contiguous rows, got strides {weight.stride()}")
    a_quant = sa is not None
    args = (a, weight, sa if a_quant else sw, sw, bias if bias is not None else sw, out,
            m, n, k, triton.next_power_of_2(m),
            a.stride(0), a.stride(1), weight.stride(0), weight.stride(1), out.stride(0), out.stride(1))
    flags = dict(A_QUANT=a_quant, PER_TOKEN=a_quant and sa.numel() > 1, PER_CHANNEL=sw.numel() > 1,
                 HAS_BIAS=bias is not None, COMPUTE_F32=compute_f32)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    if config is None and (interpreted or compute_f32):
        config = kernel.interpret_config
    if config is not None:
        cfg = dict(config)
        warps, stages = cfg.pop("num_warps", 4), cfg.pop("num_stages", 3)
        kernel.jit[grid](*args, **flags, **cfg, num_warps=warps, num_stages=stages)
    else:
        kernel.tuned[grid](*args, **flags)
    return out if out.dtype == out_dtype else out.to(out_dtype)


def fp8_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
             input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
             input_quant: InputQuant | None = InputQuant(), config: dict | None = None) -> torch.Tensor:
    """``y = fp8(x) @ W.T * scales (+ bias)`` for ``x`` ``[..., K]``; returns x's dtype.

    Activations: static with ``input_scale``, else dynamic (``InputQuant``'s strategy, per token
    by default). ``input_quant=None`` is the weight-only path.
    """
    sw = check_w8a8(x, weight, weight_scale, torch.float8_e4m3fn, bias)
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    interpreted = not x.is_cuda
    if input_quant is not None:
        a, sa = activation_codes(x2, "fp8", input_scale, input_quant)
        compute_f32 = interpreted
    else:
        a, sa = x2, None
        compute_f32 = interpreted or x.dtype == torch.float32
    problem = ScaledProblem(a, weight, sa.reshape(-1) if sa is not None else None, sw, bias)
    return scaled_gemm(KERNEL, problem, x.dtype, compute_f32, config).reshape(*lead, n)


# -- torch reference ----------------------------------------------------------------------
def fp8_gemm_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                       input_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
                       input_quant: InputQuant | None = InputQuant(), codes: torch.Tensor | None = None,
                       scales: torch.Tensor | None = None) -> torch.Tensor:
    """The same in torch: quantize activations like ``act_quant``, fp32 matmul of the codes.

    ``codes``/``scales`` take given activation codes instead (to compare the GEMM alone).
    """
    k = weight.shape[1]
    x2 = x.reshape(-1, k)
    if input_quant is None:
        a, sa = x2.float(), torch.ones(1)
    elif codes is not None:
        a, sa = codes.float(), scales.float()
    else:
        q, sa = quantize_activations_reference(x2, "fp8", activation_scale(x2, "fp8", input_scale, input_quant))
        a = q.float()
    y = (a @ weight.float().t()) * sa.reshape(-1, 1) * weight_scale.float().reshape(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


# -- QuantLinear backend ------------------------------------------------------------------
def fp8_linear(x: torch.Tensor, layer) -> torch.Tensor:
    """Backend ``("float-quantized", "triton")``: ``fn(x, layer) -> Tensor``."""
    return w8a8_linear(fp8_gemm, x, layer)


# -- benchmark entry ----------------------------------------------------------------------
def make_random(m: int, n: int, k: int, dtype=torch.bfloat16, device="cuda", seed: int = 0):
    """Random activations, an E4M3 weight and per-channel scales."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen)
    sw = w.abs().amax(dim=1, keepdim=True) / FP8_MAX
    return x.to(device), (w / sw).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(device), sw.to(device)


def bench(m: int, n: int, k: int, dtype=torch.bfloat16, timer=None, device: str = "cuda") -> dict:
    """Time ``fp8_gemm`` (activation quantization included) on CUDA; ``timer(fn) -> ms``."""
    x, w, sw = make_random(m, n, k, dtype, device)
    ms = (timer or triton.testing.do_bench)(lambda: fp8_gemm(x, w, sw))
    nbytes = w.numel() + sw.numel() * 4 + (m * k + m * n) * x.element_size()
    return {"ms": ms, "flops": 2 * m * n * k, "bytes": nbytes}
