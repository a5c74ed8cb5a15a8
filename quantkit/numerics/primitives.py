"""Quantization primitives: pure functions over tensors, no model knowledge.

Conventions (docs/DESIGN.md): weights are ``[out, in]``; integer codes are signed and held
in int8; scales have the tensor's dtype with shape ``[1]`` (tensor), ``[out, 1]``
(channel), ``[out, in // G]`` (group) or ``[..., 1]`` (token); zero points are int8 in the
signed-code domain, ``None`` when symmetric. Dequantization is
``(q - zp) * scale`` computed in the scale's dtype, the order compressed-tensors uses, so
the two decode bit-identically.

Example:
    >>> args = QuantArgs(num_bits=4, group_size=64)
    >>> q, scale, zp = quantize_weight(torch.randn(128, 256), args)
    >>> w_hat = dequantize(q, scale, zp, args)
"""

from __future__ import annotations

import dataclasses
import math

import torch

from quantkit.config.scheme import QuantArgs
from quantkit.numerics.blocks import block_reduce, expand_blocks
from quantkit.numerics.e8m0 import exponent_to_scale, scale_exponent

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448.0
FP8_EMAX = int(math.floor(math.log2(FP8_MAX)))  # 8: the E8M0 offset of MXFP8 (numerics/e8m0.py)


# -- observing ranges ----------------------------------------------------------------
def group_index(in_features: int, args: QuantArgs, g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """The group of each input column: ``g_idx`` when given, else ``j // group_size``."""
    if g_idx is not None:
        return g_idx.long()
    return torch.arange(in_features) // args.group_size


def reduce_minmax(x: torch.Tensor, args: QuantArgs, g_idx: torch.Tensor | None = None):
    """Min and max of ``x`` reduced to the shape of its scale under ``args.strategy``."""
    if args.strategy == "tensor":
        return x.amin().reshape(1), x.amax().reshape(1)
    if args.strategy in ("channel", "token"):
        return x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    if args.strategy == "block":
        return block_reduce(x, args.block_structure, "amin"), block_reduce(x, args.block_structure, "amax")
    # group
    out, cols = x.shape
    if g_idx is None:
        xg = x.reshape(out, cols // args.group_size, args.group_size)
        return xg.amin(dim=-1), xg.amax(dim=-1)
    n_groups = cols // args.group_size
    idx = group_index(cols, args, g_idx).to(x.device).expand(out, cols)
    lo = torch.full((out, n_groups), float("inf"), dtype=x.dtype, device=x.device)
    hi = torch.full((out, n_groups), float("-inf"), dtype=x.dtype, device=x.device)
    return lo.scatter_reduce(1, idx, x, "amin"), hi.scatter_reduce(1, idx, x, "amax")


def calculate_qparams(min_vals: torch.Tensor, max_vals: torch.Tensor, args: QuantArgs,
                      dtype: torch.dtype | None = None):
    """Scale and zero point from a range. Zero is always representable.

    Returns ``(scale, zero_point)``; ``zero_point`` is ``None`` for symmetric args.
    The scale is computed in fp32 and stored in ``dtype`` (default: the range's dtype).
    """
    dtype = dtype or min_vals.dtype
    lo = torch.clamp(min_vals.float(), max=0.0)
    hi = torch.clamp(max_vals.float(), min=0.0)
    if args.is_mx:   # a power of two per group (E8M0), never zero
        return exponent_to_scale(scale_exponent(torch.maximum(lo.abs(), hi), FP8_EMAX), dtype), None
    if args.type == "float":
        scale = torch.maximum(lo.abs(), hi) / FP8_MAX
        zp = None
    elif args.symmetric:
        # absmax maps to (qmax - qmin) / 2, e.g. 7.5 for 4 bits: the full code range
        # [-8, 7] is used, the largest magnitude rounds to the edge and is clamped.
        scale = torch.maximum(lo.abs(), hi) / ((args.qmax - args.qmin) / 2)
        zp = None
    else:
        scale = (hi - lo) / (args.qmax - args.qmin)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        zp = torch.round(args.qmin - lo / scale).clamp(args.qmin, args.qmax).to(torch.int8)
    # an all-zero range's scale: the scale dtype's epsilon, the value compressed-tensors writes
    floor = torch.finfo(dtype).eps if dtype.is_floating_point else 1e-12
    scale = torch.where(scale == 0, torch.full_like(scale, floor), scale).to(dtype)
    return scale, zp


# -- quantize / dequantize -------------------------------------------------------------
def _expand(t: torch.Tensor, shape: torch.Size, args: QuantArgs, g_idx: torch.Tensor | None) -> torch.Tensor:
    """Broadcast a scale or zero point to the full tensor shape."""
    if args.strategy == "block":
        return expand_blocks(t, args.block_structure, shape)
    if args.strategy != "group":
        return t
    if g_idx is None:  # contiguous groups: a broadcast view, no gather
        out, n_groups = t.shape
        return t.unsqueeze(-1).expand(out, n_groups, args.group_size).reshape(out, n_groups * args.group_size)
    return t[:, g_idx.long().to(t.device)]


def quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, args: QuantArgs,
             g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """Codes of ``x``: int8 (signed) for int args, float8_e4m3fn for float args."""
    s = _expand(scale, x.shape, args, g_idx).float()
    if args.type == "float":
        return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    v = x.float() / s
    if zero_point is not None:
        v = v + _expand(zero_point, x.shape, args, g_idx).float()
    return torch.round(v).clamp(args.qmin, args.qmax).to(torch.int8)


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, args: QuantArgs,
               g_idx: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values from codes: ``(q - zp) * scale`` in the scale's dtype."""
    s = _expand(scale, q.shape, args, g_idx)
    v = q.to(s.dtype)
    if zero_point is not None:
        v = v - _expand(zero_point, q.shape, args, g_idx).to(s.dtype)
    v = v * s
    return v if dtype is None else v.to(dtype)


def fake_quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor | None, args: QuantArgs,
                  g_idx: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize then dequantize, returned in ``x``'s dtype."""
    return dequantize(quantize(x, scale, zero_point, args, g_idx), scale, zero_point, args, g_idx, x.dtype)


# -- convenience: weights and dynamic activations ---------------------------------------------
def _mse_range(w: torch.Tensor, args: QuantArgs, g_idx: torch.Tensor | None, grid: int = 40,
               max_shrink: float = 0.6):
    """Clipping search: each range scaled towards zero by the candidate with the least squared error.

    Candidates are the min-max range scaled by ``1 - max_shrink * i / grid``, ``i < grid``;
    each scale (row, group or tensor) keeps the candidate with the least squared error, the
    earliest on ties. Every scale's search is independent of the others', so contiguous
    groups are searched as rows of ``G`` columns.
    """
    if args.strategy == "group" and g_idx is None:
        out, cols = w.shape
        per_row = dataclasses.replace(args, strategy="channel", group_size=None, actorder=None)
        lo, hi = _mse_search(w.reshape(-1, args.group_size), per_row, None, grid, max_shrink)
        return lo.reshape(out, cols // args.group_size), hi.reshape(out, cols // args.group_size)
    return _mse_search(w, args, g_idx, grid, max_shrink)


def _mse_search(w: torch.Tensor, args: QuantArgs, g_idx: torch.Tensor | None, grid: int, max_shrink: float):
    if args.strategy not in ("channel", "token") or w.dim() != 2:
        return _mse_search_reference(w, args, g_idx, grid, max_shrink)
    # Per row. The candidates' ranges and qparams are computed together (element-wise, the
    # same operations as one at a time); the error of each candidate costs seven in-place
    # passes over the rows instead of the twenty-odd of fake_quantize and its bookkeeping.
    lo, hi = reduce_minmax(w, args, None)                         # [rows, 1]
    p = torch.tensor([1.0 - max_shrink * i / grid for i in range(grid)], device=w.device).reshape(grid, 1, 1)
    cand_lo, cand_hi = (lo.float() * p).to(lo.dtype), (hi.float() * p).to(hi.dtype)  # as lo * float
    scale, zp = calculate_qparams(cand_lo, cand_hi, args, dtype=w.dtype)
    s32 = scale.float()
    z32 = None if zp is None else zp.float()
    x = w.float()
    errs = torch.empty(grid, w.shape[0], dtype=torch.float32, device=w.device)
    v = torch.empty_like(x)
    for i in range(grid):
        torch.div(x, s32[i], out=v)
        if z32 is not None:
            v.add_(z32[i])
        v.round_().clamp_(args.qmin, args.qmax)
        if z32 is not None:
            v.sub_(z32[i])
        v.mul_(s32[i])
        if w.dtype != torch.float32:
            v.copy_(v.to(w.dtype))  # the dequantized value is held in the weight's dtype
        v.sub_(x).pow_(2)
        torch.sum(v, dim=-1, out=errs[i])
    best = torch.argmin(errs, dim=0).reshape(1, -1, 1)  # the first minimum: the earliest candidate on ties
    return cand_lo.gather(0, best)[0], cand_hi.gather(0, best)[0]


def _mse_search_reference(w: torch.Tensor, args: QuantArgs, g_idx: torch.Tensor | None, grid: int,
                          max_shrink: float):
    """The search one candidate at a time through ``fake_quantize`` (the definition)."""
    lo, hi = reduce_minmax(w, args, g_idx)
    best_lo, best_hi = lo.clone(), hi.clone()
    best_err = torch.full_like(lo, float("inf"), dtype=torch.float32)
    w32 = w.float()
    for i in range(grid):
        p = 1.0 - max_shrink * i / grid
        cand_lo, cand_hi = lo * p, hi * p
        scale, zp = calculate_qparams(cand_lo, cand_hi, args, dtype=w.dtype)
        err = (fake_quantize(w, scale, zp, args, g_idx).float() - w32).pow_(2)
        err = reduce_sum(err, args, g_idx, lo.shape)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_lo = torch.where(better, cand_lo, best_lo)
        best_hi = torch.where(better, cand_hi, best_hi)
    return best_lo, best_hi


def reduce_sum(err: torch.Tensor, args: QuantArgs, g_idx: torch.Tensor | None, shape) -> torch.Tensor:
    """Per-element ``err`` summed to the shape of its scale under ``args`` (``shape``: the groups' scale shape)."""
    if args.strategy == "tensor":
        return err.sum().reshape(1)
    if args.strategy in ("channel", "token"):
        return err.sum(dim=-1, keepdim=True)
    if args.strategy == "block":
        return block_reduce(err, args.block_structure, "sum")
    out, cols = err.shape
    idx = group_index(cols, args, g_idx).to(err.device).expand(out, cols)
    return torch.zeros(shape, dtype=err.dtype, device=err.device).scatter_add(1, idx, err)


def weight_qparams(w: torch.Tensor, args: QuantArgs, g_idx: torch.Tensor | None = None):
    """Scale and zero point for a weight under ``args`` (min-max or MSE-clipped range)."""
    if args.type == "float" and args.num_bits == 4:
        # FP4's scales are FP8 under a global scale, or E8M0: the integer/FP8 path would make FP8 codes
        raise ValueError("FP4 weights are quantized by numerics/fp4_numerics.py, not the integer/FP8 primitives")
    if args.observer == "mse":
        lo, hi = _mse_range(w, args, g_idx)
    else:
        lo, hi = reduce_minmax(w, args, g_idx)
    return calculate_qparams(lo, hi, args, dtype=w.dtype)


def quantize_weight(w: torch.Tensor, args: QuantArgs, g_idx: torch.Tensor | None = None):
    """Round-to-nearest: ``(codes, scale, zero_point)`` for a weight."""
    scale, zp = weight_qparams(w, args, g_idx)
    return quantize(w, scale, zp, args, g_idx), scale, zp


# Dynamic activation scales follow vLLM's serving kernels: int8 absmax / 127, fp8 absmax / 448
# with a floor of 1 / (448 * 512), so what quantkit computes is what the deployment computes.
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


def quantize_dynamic_per_token(x: torch.Tensor, float_type: bool):
    """Symmetric per-token codes and fp32 scales ``[..., 1]`` for activations ``[..., hidden]``."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    if float_type:
        scale = (amax / FP8_MAX).clamp_min(FP8_MIN_SCALE)
        return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale
    scale = (amax / 127.0).clamp_min(1e-10)
    return torch.round(x.float() / scale).clamp(-128, 127).to(torch.int8), scale


def sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio in dB."""
    ref, approx = ref.float(), approx.float()
    noise = torch.linalg.vector_norm(ref - approx).double() ** 2
    signal = torch.linalg.vector_norm(ref).double() ** 2
    return float(10 * torch.log10(signal / noise.clamp_min(1e-300)))
