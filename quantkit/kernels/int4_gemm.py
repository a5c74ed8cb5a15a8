"""W4A16 GEMM: fp16/bf16/fp32 activations times packed int4 (also int2/int8) weights.

Reads the pack-quantized tensors of docs/DESIGN.md: ``weight_packed`` int32 ``[N, K*b/32]``
(element ``k`` of row ``n`` at bits ``b*(k % (32/b))`` of word ``k // (32/b)``, offset by
``2^(b-1)``), group scales ``[N, G]``, zero points packed along dim 0
``[ceil(N*b/32), G]``, and an optional ``g_idx`` ``[K]``. ``y = x @ dequant(W).T`` with fp32
accumulation.

The kernel addresses the weight as a ``[K/(32/b), N]`` word matrix through strides, so it
runs on the on-disk tensor (a transposed view, no copy) or on the repacked copy
``weight_packed.t().contiguous()`` whose rows are contiguous along N (16-byte loads on a
GPU); ``repack`` makes that copy once per layer, and sorts act-order columns into
contiguous groups. Each K tile loads its words once and splits them into codes in registers.
When a K tile lies inside one group, the scale multiplies the tile's dot product (exact
integer codes in the dot); otherwise (``g_idx``, small groups) each code is scaled.
Two launch shapes: for ``M <= DECODE_MAX_M`` a 16-row tile with split-K (partial sums
atomically added into an fp32 buffer) so that a GEMV still fills the GPU; above it, large
tiles without split-K.

Example:
    >>> packed = PackedWeight(weight_packed, scale, zero_point, g_idx, (N, K), num_bits=4, group_size=128)  # doctest: +SKIP
    >>> y = w4a16_gemm(x, repack(packed))        # x: [M, K] fp16 on CUDA  # doctest: +SKIP
    >>> y_ref = w4a16_reference(x, packed)       # the same product in torch  # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from quantkit.formats.packing import pack_int32, unpack_int32
from quantkit.kernels.act_quant import check_runnable, grouped_tile

# -- configs ------------------------------------------------------------------------------
DECODE_MAX_M = 16
_DECODE = [  # (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages)
    (64, 128, 1, 4, 4), (64, 128, 4, 4, 4), (64, 256, 4, 4, 3), (128, 128, 2, 4, 4),
    (128, 128, 4, 4, 4), (128, 256, 8, 8, 3), (256, 64, 4, 8, 4), (32, 256, 8, 4, 3),
]
_PREFILL = [  # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
    (64, 128, 64, 4, 4), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 256, 64, 8, 4),
    (128, 64, 128, 4, 3), (256, 128, 64, 8, 3),
]
DECODE_CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": n, "BLOCK_K": k, "SPLIT_K": s, "GROUP_M": 1},
                  num_warps=w, num_stages=st) for n, k, s, w, st in _DECODE]
PREFILL_CONFIGS = [
    triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "SPLIT_K": 1, "GROUP_M": 8},
                  num_warps=w, num_stages=st) for m, n, k, w, st in _PREFILL]
# Under TRITON_INTERPRET=1 every program runs in numpy: one fixed config per path, big
# blocks so that small test shapes take few programs (docs/PLATFORM.md). fp32 activations on a
# GPU use them too: IEEE fp32 dots compile slowly, autotuning them would take minutes.
INTERPRET_DECODE = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 2, "GROUP_M": 1}
INTERPRET_PREFILL = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 4}
_AUTOTUNE_KEY = ["M_BUCKET", "N", "K", "group_size", "HAS_ZP", "HAS_GIDX"]


# -- kernel -------------------------------------------------------------------------------
@triton.jit
def _w4a16_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, g_ptr, b_ptr, out_ptr,
    M, N, K, KW, group_size, M_BUCKET,
    stride_xm, stride_xk,
    stride_qk, stride_qn,  # word row (k // PACK), column n
    stride_sg, stride_sn,
    stride_zn, stride_zg,  # zero-point word (n // PACK), group
    stride_om, stride_on,
    BITS: tl.constexpr, HAS_ZP: tl.constexpr, HAS_GIDX: tl.constexpr, HAS_BIAS: tl.constexpr,
    GROUP_TILE: tl.constexpr, COMPUTE_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    PACK: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    OFFSET: tl.constexpr = 1 << (BITS - 1)

    # grouped ordering of output tiles: GROUP_M row tiles share each weight column tile
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    if HAS_ZP:
        z_shift = (offs_n % PACK) * BITS

    acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
    # split-K interleaves K tiles: split s takes tiles s, s + SPLIT_K, ...
    for k0 in range(pid_k * BLOCK_K, K, BLOCK_K * SPLIT_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        if COMPUTE_F32:  # fp32 activations, or bf16 under the interpreter (bf16 math is broken there)
            x = x.to(tl.float32)
        mask_kn = mask_k[:, None] & mask_n[None, :]
        # each word once ([BLOCK_K / PACK, BLOCK_N], contiguous along N after repack), then
        # split into its PACK codes: row w * PACK + j of the tile is code j of word row w
        offs_w = k0 // PACK + tl.arange(0, BLOCK_K // PACK)
        words = tl.load(qw_ptr + offs_w[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                        mask=(offs_w[:, None] < KW) & mask_n[None, :], other=0)
        shifts = tl.arange(0, PACK) * BITS
        # codes stay offset by 2^(b-1); subtracting the (offset) zero point removes it
        q = tl.reshape((words[:, None, :] >> shifts[None, :, None]) & MASK, (BLOCK_K, BLOCK_N))
        if GROUP_TILE:
            # the whole K tile lies in one group: scale after the dot, on [BLOCK_N] only
            g = k0 // group_size
            s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0).to(tl.float32)
            if HAS_ZP:
                zw = tl.load(z_ptr + (offs_n // PACK) * stride_zn + g * stride_zg, mask=mask_n, other=0)
                w = q - ((zw >> z_shift) & MASK)[None, :]
            else:
                w = q - OFFSET
            # integer codes are exact in fp16/bf16, so the dot is exact up to accumulation
            if COMPUTE_F32:  # fp32 activations: no tf32 truncation on a GPU
                acc += tl.dot(x, w.to(tl.float32), input_precision="ieee") * s[None, :]
            else:
                acc += tl.dot(x, w.to(x.dtype)) * s[None, :]
        else:
            if HAS_GIDX:
                g = tl.load(g_ptr + offs_k, mask=mask_k, other=0)
            else:
                g = offs_k // group_size
            s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn,
                        mask=mask_kn, other=0.0).to(tl.float32)
            if HAS_ZP:
                zw = tl.load(z_ptr + (offs_n[None, :] // PACK) * stride_zn + g[:, None] * stride_zg,
                             mask=mask_kn, other=0)
                w = (q - ((zw >> z_shift[None, :]) & MASK)).to(tl.float32) * s
            else:
                w = (q - OFFSET).to(tl.float32) * s
            if COMPUTE_F32:
                acc += tl.dot(x, w, input_precision="ieee")
            else:
                acc += tl.dot(x, w.to(x.dtype))

    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        acc += tl.where(pid_k == 0, 1.0, 0.0) * bias[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    mask_mn = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_mn)
    else:
        tl.atomic_add(out_ptrs, acc, mask=mask_mn)


def _group_tile(args) -> bool:
    """Every K tile lies inside one group (no g_idx, BLOCK_K divides the group or one group)."""
    return not args["HAS_GIDX"] and (args["group_size"] % args["BLOCK_K"] == 0 or args["group_size"] >= args["K"])


_w4a16 = triton.heuristics({"GROUP_TILE": _group_tile})(_w4a16_kernel)


def _autotuned(configs, do_bench=None, reset=False):
    kwargs = {"do_bench": do_bench} if do_bench is not None else {}
    if reset:  # split-K configs add into the output: zero it before each timed run
        kwargs["reset_to_zero"] = ["out_ptr"]
    return triton.autotune(configs=configs, key=_AUTOTUNE_KEY, **kwargs)(_w4a16)


_decode_tuned = _autotuned(DECODE_CONFIGS, reset=True)
_prefill_tuned = _autotuned(PREFILL_CONFIGS)


# -- weights: checks and the one-time repack ---------------------------------------------
@dataclass
class W4Weights:
    """Kernel-ready views of a pack-quantized weight (see ``repack``)."""

    qweight: torch.Tensor         # int32 [ceil(K / PACK), N] (any strides)
    scale: torch.Tensor           # [G, N] (any strides)
    zero_point: torch.Tensor | None  # int32 [ceil(N / PACK), G], packed along dim 0
    g_idx: torch.Tensor | None    # int32 [K]
    in_features: int
    out_features: int
    num_bits: int
    group_size: int               # K for channel / tensor scales
    perm: torch.Tensor | None = None  # int64 [K]: x's columns in the weight's (group-sorted) order


@dataclass(frozen=True)
class PackedWeight:
    """A pack-quantized weight as the checkpoint stores it; what ``repack`` and ``w4a16_reference`` read."""

    packed: torch.Tensor                # weight_packed: int32 [N, ceil(K / PACK)]
    scale: torch.Tensor                 # weight_scale: [N, G], [N, 1] or [1]
    zero_point: torch.Tensor | None     # weight_zero_point: int32 [ceil(N / PACK), G], packed along dim 0
    g_idx: torch.Tensor | None          # weight_g_idx: [K]
    shape: tuple[int, int]              # weight_shape: (N, K)
    num_bits: int = 4
    group_size: int | None = None       # None: one scale per row


def repack(weight: PackedWeight, contiguous: bool = True, sort_groups: bool = True) -> W4Weights:
    """Check the on-disk tensors and return the kernel's view of them.

    ``contiguous=True`` copies the words to ``[K / PACK, N]`` with N contiguous and scales to
    ``[G, N]`` (one-time, at load); ``False`` returns transposed views of the on-disk
    tensors (no copy). Both give the same results: the kernel only sees strides.

    With a ``g_idx`` whose groups all hold ``group_size`` columns (GPTQ act-order),
    ``sort_groups`` (with ``contiguous``) reorders the weight's columns so that each group is
    contiguous, and the kernel gathers ``x``'s columns in that order instead: the fast
    one-group-per-tile path then serves act-order checkpoints too.
    """
    weight_packed, weight_scale, weight_zero_point, weight_g_idx = (
        weight.packed, weight.scale, weight.zero_point, weight.g_idx)
    num_bits, group_size = weight.num_bits, weight.group_size
    n, k = (int(v) for v in weight.shape)
    if num_bits not in (2, 4, 8):
        raise ValueError(f"num_bits: the Triton pack-quantized kernel supports 2, 4 or 8 bits, got {num_bits}")
    pack = 32 // num_bits
    if weight_packed.dtype != torch.int32 or tuple(weight_packed.shape) != (n, math.ceil(k / pack)):
        raise ValueError(f"weight_packed: expected int32 [{n}, {math.ceil(k / pack)}] for weight_shape "
                         f"[{n}, {k}] at {num_bits} bits, got {weight_packed.dtype} {list(weight_packed.shape)}")
    scale = weight_scale.reshape(1, 1) if weight_scale.dim() == 1 else weight_scale
    if scale.numel() == 1:  # per-tensor: one channel scale for every row
        scale = scale.expand(n, 1)
    if scale.dim() != 2 or scale.shape[0] != n or not scale.dtype.is_floating_point:
        raise ValueError(f"weight_scale: expected a float tensor [{n}, G], [{n}, 1] or [1], "
                         f"got {scale.dtype} {list(weight_scale.shape)}")
    n_groups = scale.shape[1]
    if n_groups == 1 and group_size is None:
        group_size = k
    elif group_size is None:
        raise ValueError(f"weight_scale: {n_groups} groups per row but group_size is None")
    elif weight_g_idx is None and n_groups != math.ceil(k / group_size):
        raise ValueError(f"weight_scale: expected {math.ceil(k / group_size)} groups for in_features={k} "
                         f"and group_size={group_size}, got shape {list(scale.shape)}")
    if weight_zero_point is not None:
        zshape = (math.ceil(n / pack), n_groups)
        if weight_zero_point.dtype != torch.int32 or tuple(weight_zero_point.shape) != zshape:
            raise ValueError(f"weight_zero_point: expected int32 {list(zshape)} (packed along dim 0), "
                             f"got {weight_zero_point.dtype} {list(weight_zero_point.shape)}")
    g_idx = None
    if weight_g_idx is not None:
        if tuple(weight_g_idx.shape) != (k,):
            raise ValueError(f"weight_g_idx: expected [{k}], got {list(weight_g_idx.shape)}")
        g_idx = weight_g_idx.to(torch.int32).contiguous()
        if g_idx.numel() and (int(g_idx.min()) < 0 or int(g_idx.max()) >= n_groups):
            raise ValueError(f"weight_g_idx: values must lie in [0, {n_groups}), "
                             f"got [{int(g_idx.min())}, {int(g_idx.max())}]")
    perm = None
    if g_idx is not None and contiguous and sort_groups and n_groups * group_size == k and \
            bool((torch.bincount(g_idx.long(), minlength=n_groups) == group_size).all()):
        perm = torch.argsort(g_idx.long(), stable=True)
        codes = unpack_int32(weight_packed, num_bits, (n, k), dim=1)[:, perm]
        weight_packed, g_idx = pack_int32(codes.contiguous(), num_bits, dim=1), None
    qweight, scale_t = weight_packed.t(), scale.t()
    if contiguous:
        qweight, scale_t = qweight.contiguous(), scale_t.contiguous()
    return W4Weights(qweight, scale_t, weight_zero_point, g_idx, k, n, num_bits, int(group_size), perm)


# -- launch -------------------------------------------------------------------------------
def _launch_params(x: torch.Tensor) -> tuple[torch.dtype, bool]:
    """(kernel output dtype, compute in fp32) for activations ``x``."""
    interpreted = not x.is_cuda
    if x.dtype == torch.float32:
        return torch.float32, True
    if x.dtype == torch.bfloat16 and interpreted:
        # interpreter: bf16 arithmetic and fp32->bf16 casts are broken (docs/PLATFORM.md);
        # compute and store fp32, cast with torch
        return torch.float32, True
    return x.dtype, False


def w4a16_gemm(x: torch.Tensor, w: W4Weights, bias: torch.Tensor | None = None,
               config: dict | None = None, autotune: bool | None = None) -> torch.Tensor:
    """``x @ dequant(W).T (+ bias)`` for ``x`` ``[..., K]`` in fp16/bf16/fp32; returns x's dtype.

    ``config`` pins the launch (a dict like ``INTERPRET_DECODE``). Otherwise the autotuned
    kernels run (the default on CUDA) or, under the interpreter, the fixed interpreter configs.
    """
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"x: expected float16, bfloat16 or float32 activations, got {x.dtype}")
    if x.shape[-1] != w.in_features:
        raise ValueError(f"x: last dimension {x.shape[-1]} does not match in_features={w.in_features}")
    if x.device != w.qweight.device:
        raise ValueError(f"x: on {x.device} but weight_packed is on {w.qweight.device}")
    if bias is not None and tuple(bias.shape) != (w.out_features,):
        raise ValueError(f"bias: expected [{w.out_features}], got {list(bias.shape)}")
    check_runnable(x, _w4a16_kernel)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, w.in_features)
    if w.perm is not None:
        x2 = x2.index_select(1, w.perm)
    elif x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, n, k = x2.shape[0], w.out_features, w.in_features
    out_dtype, compute_f32 = _launch_params(x)
    decode = m <= DECODE_MAX_M
    if autotune is None:
        autotune = x.is_cuda and not compute_f32
    if config is None and not autotune:
        config = INTERPRET_DECODE if decode else INTERPRET_PREFILL
    split = config["SPLIT_K"] if config is not None else None
    atomic = decode if config is None else split > 1
    out = torch.zeros((m, n), dtype=torch.float32, device=x.device) if atomic else \
        torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return out.to(x.dtype).reshape(*lead, n)

    dummy = w.qweight
    zp = w.zero_point if w.zero_point is not None else dummy
    args = (x2, w.qweight, w.scale, zp, w.g_idx if w.g_idx is not None else dummy,
            bias if bias is not None else dummy, out,
            m, n, k, w.qweight.shape[0], w.group_size, triton.next_power_of_2(m),
            x2.stride(0), x2.stride(1), w.qweight.stride(0), w.qweight.stride(1),
            w.scale.stride(0), w.scale.stride(1),
            zp.stride(0) if w.zero_point is not None else 0, zp.stride(1) if w.zero_point is not None else 0,
            out.stride(0), out.stride(1))
    flags = dict(BITS=w.num_bits, HAS_ZP=w.zero_point is not None, HAS_GIDX=w.g_idx is not None,
                 HAS_BIAS=bias is not None, COMPUTE_F32=compute_f32)

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])

    if config is not None:
        kernel_config = dict(config)
        warps = kernel_config.pop("num_warps", 4)
        stages = kernel_config.pop("num_stages", 3)
        _w4a16[grid](*args, **flags, **kernel_config, num_warps=warps, num_stages=stages)
    else:
        (_decode_tuned if decode else _prefill_tuned)[grid](*args, **flags)
    if out.dtype != x.dtype:
        out = out.to(x.dtype)
    return out.reshape(*lead, n)


# -- torch reference ----------------------------------------------------------------------
def unpack_codes(words: torch.Tensor, num_bits: int, length: int, dim: int = 1) -> torch.Tensor:
    """Signed int8 codes from int32 words packed along ``dim`` (``length`` elements)."""
    pack = 32 // num_bits
    w = words.t() if dim == 0 else words
    shifts = torch.arange(pack, device=w.device, dtype=torch.int32) * num_bits
    codes = (w.unsqueeze(-1) >> shifts) & ((1 << num_bits) - 1)
    codes = codes.reshape(w.shape[0], -1)[:, :length] - (1 << (num_bits - 1))
    codes = codes.to(torch.int8)
    return codes.t() if dim == 0 else codes


def w4a16_reference(x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same product in torch from the on-disk tensors: DESIGN.md's dequant, fp32 matmul."""
    n, k = (int(v) for v in weight.shape)
    q = unpack_codes(weight.packed, weight.num_bits, k)
    scale = weight.scale.reshape(1, 1).expand(n, 1) if weight.scale.numel() == 1 else weight.scale
    if weight.g_idx is not None:
        cols = weight.g_idx.long()
    elif scale.shape[1] == 1:
        cols = torch.zeros(k, dtype=torch.long, device=q.device)
    else:
        cols = torch.arange(k, device=q.device) // weight.group_size
    s = scale[:, cols]
    v = q.to(s.dtype)
    if weight.zero_point is not None:
        zp = unpack_codes(weight.zero_point, weight.num_bits, n, dim=0)
        v = v - zp[:, cols].to(s.dtype)
    w = (v * s).float()
    y = x.float() @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


# -- QuantLinear backend ------------------------------------------------------------------
def _layer_weights(layer) -> W4Weights:
    """The layer's repacked weights, made once and kept in ``layer._cache`` (keyed by storage,
    so moving or reloading the layer's tensors repacks)."""
    key = (layer.weight_packed.data_ptr(), layer.weight_packed.device, layer.weight_scale.data_ptr())
    cache = layer.__dict__.setdefault("_cache", {})
    cached = cache.get("triton_w4")
    if cached is not None and cached[0] == key:
        return cached[1]
    shape = layer.weight_shape.tolist() if torch.is_tensor(layer.weight_shape) else layer.weight_shape
    w = repack(PackedWeight(layer.weight_packed, layer.weight_scale, getattr(layer, "weight_zero_point", None),
                            getattr(layer, "weight_g_idx", None), shape, layer.num_bits, layer.group_size))
    cache["triton_w4"] = (key, w)
    return w


def w4a16_linear(x: torch.Tensor, layer) -> torch.Tensor:
    """Backend ``("pack-quantized", "triton")``: ``fn(x, layer) -> Tensor``."""
    return w4a16_gemm(x, _layer_weights(layer), getattr(layer, "bias", None))


# -- benchmark entry ----------------------------------------------------------------------
def make_random(m: int, n: int, k: int, dtype=torch.float16, device="cuda", group_size: int = 128,
                symmetric: bool = True, seed: int = 0):
    """Random activations and pack-quantized tensors of the on-disk layout (for benchmarks)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    packed = pack_int32(torch.randint(-8, 8, (n, k), generator=gen, dtype=torch.int8), 4, dim=1)
    n_groups = math.ceil(k / group_size)
    scale = (torch.rand(n, n_groups, generator=gen) * 0.02 + 0.005).to(dtype)
    zp = None if symmetric else pack_int32(torch.randint(-8, 8, (n, n_groups), generator=gen, dtype=torch.int8), 4, dim=0)
    return x.to(device), packed.to(device), scale.to(device), None if zp is None else zp.to(device)


def bench(m: int, n: int, k: int, dtype=torch.float16, group_size: int = 128, timer=None,
          device: str = "cuda") -> dict:
    """Time ``w4a16_gemm`` on CUDA: milliseconds and bytes moved (weights + activations + output).

    ``timer(fn) -> ms`` defaults to ``triton.testing.do_bench``; ``benchmarks/kernel_bench.py`` runs it
    (``device="cpu"`` with a wall-clock timer under the interpreter for its dry run)."""
    x, packed, scale, _ = make_random(m, n, k, dtype, device, group_size)
    w = repack(PackedWeight(packed, scale, None, None, (n, k), 4, group_size))
    ms = (timer or triton.testing.do_bench)(lambda: w4a16_gemm(x, w))
    nbytes = packed.numel() * 4 + scale.numel() * scale.element_size() + (m * k + m * n) * x.element_size()
    return {"ms": ms, "flops": 2 * m * n * k, "bytes": nbytes}
