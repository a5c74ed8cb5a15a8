"""W4A16 kernel vs the torch reference, on tensors written by the spine's packer."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

from quantkit.formats.packing import pack_int32, unpack_int32
from quantkit.kernels import int4_gemm as k4
from quantkit.numerics.primitives import dequantize, quantize_weight
from quantkit.config.scheme import QuantArgs

from kernel_testing import DEVICE, REL_TOL, rel_err


def make_weight(n, k, bits=4, group_size=64, symmetric=True, act_order=False, dtype=torch.float16, seed=0):
    """A random weight quantized by the spine (RTN) and packed as on disk."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen).to(dtype)
    if group_size is None:
        args = QuantArgs(num_bits=bits, strategy="channel", symmetric=symmetric)
    else:
        args = QuantArgs(num_bits=bits, group_size=group_size, symmetric=symmetric,
                         actorder="group" if act_order else None)
    g_idx = None
    if act_order:  # act-order "group": a permutation assigns columns to groups
        g_idx = (torch.randperm(k, generator=gen) // group_size).to(torch.int32)
    q, scale, zp = quantize_weight(w, args, g_idx)
    t = {"weight_packed": pack_int32(q, bits, dim=1), "weight_scale": scale, "weight_shape": (n, k),
         "weight_zero_point": None if zp is None else pack_int32(zp, bits, dim=0), "weight_g_idx": g_idx}
    return t, (q, scale, zp, args)


CASES = [  # m, n, k, bits, group, symmetric, act_order, dtype, bias
    (1, 96, 256, 4, 64, True, False, torch.float16, False),     # GEMV, tiles inside groups
    (1, 130, 320, 4, 32, False, False, torch.float16, True),    # asym, group < BLOCK_K, bias
    (5, 72, 200, 4, 40, True, True, torch.bfloat16, False),     # g_idx, group not a power of 2
    (4, 50, 100, 4, None, False, False, torch.float16, False),  # channel-wise asym, K % 8 != 0
    (9, 40, 60, 4, 20, True, True, torch.bfloat16, True),       # K % 8 != 0, last word partial, g_idx
    (16, 64, 384, 4, 128, False, True, torch.float16, False),   # largest decode M, g_idx + asym
    (17, 100, 256, 4, 64, False, False, torch.bfloat16, True),  # smallest prefill M
    (40, 64, 192, 4, None, True, False, torch.float32, False),  # channel-wise, fp32
    (33, 136, 128, 4, 128, True, False, torch.float16, False),  # one group per row
    (3, 40, 128, 8, 32, True, False, torch.float16, False),     # 8-bit pack-quantized
    (20, 48, 256, 2, 64, False, False, torch.float16, False),   # 2-bit, asym
]


@pytest.mark.parametrize("m,n,k,bits,group,sym,act_order,dtype,bias", CASES)
def test_matches_reference(m, n, k, bits, group, sym, act_order, dtype, bias):
    t, (q, scale, zp, args) = make_weight(n, k, bits, group, sym, act_order, dtype, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(dtype)
    b = torch.randn(n).to(dtype) if bias else None
    ref = k4.w4a16_reference(x, k4.PackedWeight(t["weight_packed"], scale, t["weight_zero_point"], t["weight_g_idx"],
                                                (n, k), bits, group), bias=b)
    # the reference itself decodes what the spine encoded
    w_spine = dequantize(q, scale, zp, args, t["weight_g_idx"]).float()
    truth = x.float() @ w_spine.t() + (b.float() if bias else 0)
    assert rel_err(ref, truth) < REL_TOL[dtype]

    for sort_groups in (True, False) if act_order else (True,):  # act-order: sorted groups, and g_idx
        w = k4.repack(k4.PackedWeight(*(v.to(DEVICE) if torch.is_tensor(v) else v for v in (
            t["weight_packed"], scale, t["weight_zero_point"], t["weight_g_idx"])), (n, k), bits, group),
            sort_groups=sort_groups)
        out = k4.w4a16_gemm(x.to(DEVICE), w, None if b is None else b.to(DEVICE))
        assert out.dtype == dtype and out.shape == (m, n)
        assert rel_err(out, ref) < REL_TOL[dtype], rel_err(out, ref)
        # elementwise: no single output is far off (one rounding of the largest value)
        assert (out.double().cpu() - ref.double()).abs().max() <= 4 * REL_TOL[dtype] * ref.double().abs().max()


def test_on_disk_layout_and_repack_agree():
    """The kernel on the checkpoint tensors (views) and on the repacked copy give the same bits."""
    n, k = 72, 200
    t, (q, scale, zp, _) = make_weight(n, k, 4, 40, symmetric=False, act_order=True)
    # the spine's packing is the compressed-tensors layout
    assert torch.equal(t["weight_packed"], pack_to_int32(q, 4))
    assert torch.equal(t["weight_zero_point"], pack_to_int32(zp, 4, packed_dim=0))
    weight = k4.PackedWeight(t["weight_packed"], scale, t["weight_zero_point"], t["weight_g_idx"], (n, k), 4, 40)
    views = k4.repack(weight, contiguous=False)
    packed = k4.repack(weight, sort_groups=False)
    assert views.qweight.data_ptr() == t["weight_packed"].data_ptr()  # no copy
    assert packed.qweight.is_contiguous() and packed.qweight.shape == (math.ceil(k / 8), n)
    # the repacked words hold the same codes, now packed along K in columns
    assert torch.equal(unpack_int32(packed.qweight.t().contiguous(), 4, (n, k), dim=1), q)
    assert torch.equal(k4.unpack_codes(packed.qweight, 4, k, dim=0).t(), q)
    x = torch.randn(9, k).half()
    assert torch.equal(k4.w4a16_gemm(x, views), k4.w4a16_gemm(x, packed))
    # act-order sorted into contiguous groups: column j of the sorted weight is column perm[j]
    sorted_ = k4.repack(weight)
    assert sorted_.g_idx is None and torch.equal(t["weight_g_idx"][sorted_.perm], torch.arange(k) // 40)
    assert torch.equal(unpack_int32(sorted_.qweight.t().contiguous(), 4, (n, k), dim=1), q[:, sorted_.perm])
    ref = k4.w4a16_reference(x, weight)
    assert rel_err(k4.w4a16_gemm(x, sorted_), ref) < REL_TOL[torch.float16]
    # unequal groups keep the g_idx path
    uneven = t["weight_g_idx"].clone()
    uneven[uneven == 0] = 1
    assert k4.repack(k4.PackedWeight(t["weight_packed"], scale, t["weight_zero_point"], uneven, (n, k), 4, 40)).perm is None


def test_batched_input_and_empty():
    n, k = 64, 128
    t, (q, scale, zp, _) = make_weight(n, k, 4, 64)
    w = k4.repack(k4.PackedWeight(t["weight_packed"], scale, None, None, (n, k), 4, 64))
    x = torch.randn(2, 3, k).half()
    out = k4.w4a16_gemm(x, w)
    ref = k4.w4a16_reference(x.reshape(6, k), k4.PackedWeight(t["weight_packed"], scale, None, None, (n, k), 4, 64))
    assert out.shape == (2, 3, n) and rel_err(out.reshape(6, n), ref) < REL_TOL[torch.float16]
    assert k4.w4a16_gemm(torch.empty(0, k).half(), w).shape == (0, n)


def _all_configs():
    return [("decode", c) for c in k4.DECODE_CONFIGS] + [("prefill", c) for c in k4.PREFILL_CONFIGS]


def _config_id(v):
    if isinstance(v, str):
        return v
    names = {"BLOCK_M": "m", "BLOCK_N": "n", "BLOCK_K": "k", "SPLIT_K": "split"}
    return "-".join(f"{names[key]}{val}" for key, val in v.kwargs.items() if key in names)


@pytest.mark.parametrize("path,cfg", _all_configs(), ids=_config_id)
def test_every_autotune_config(path, cfg):
    """Each config the GPU autotuner may pick computes the same product (both group paths)."""
    n, k = 80, 320  # group 64: BLOCK_K 64 scales after the dot, 128/256 per element
    t, (q, scale, zp, _) = make_weight(n, k, 4, 64, symmetric=False, seed=3)
    m = 3 if path == "decode" else 37
    x = torch.randn(m, k).half()
    weight = k4.PackedWeight(t["weight_packed"], scale, t["weight_zero_point"], None, (n, k), 4, 64)
    w = k4.repack(weight)
    config = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    out = k4.w4a16_gemm(x, w, config=config)
    ref = k4.w4a16_reference(x, weight)
    assert rel_err(out, ref) < REL_TOL[torch.float16]


@pytest.mark.parametrize("m", [2, 24])
def test_autotuned_launch(monkeypatch, m):
    """The autotuned path (grid from the chosen config, split-K buffer reset between trials)."""
    calls = []

    def one_run(kernel_call, quantiles):  # the interpreter has no GPU timer: run once, fake a time
        kernel_call()
        calls.append(1)
        return [float(len(calls))] * len(quantiles)

    monkeypatch.setattr(k4, "_decode_tuned", k4._autotuned(k4.DECODE_CONFIGS[:3], do_bench=one_run, reset=True))
    monkeypatch.setattr(k4, "_prefill_tuned", k4._autotuned(k4.PREFILL_CONFIGS[:2], do_bench=one_run))
    n, k = 64, 256
    t, (q, scale, zp, _) = make_weight(n, k, 4, 128, symmetric=False, seed=5)
    weight = k4.PackedWeight(t["weight_packed"], scale, t["weight_zero_point"], None, (n, k), 4, 128)
    w = k4.repack(weight)
    x = torch.randn(m, k).half()
    ref = k4.w4a16_reference(x, weight)
    for _ in range(2):  # the second call reuses the cached choice
        out = k4.w4a16_gemm(x, w, autotune=True)
        assert rel_err(out, ref) < REL_TOL[torch.float16]
    assert len(calls) >= 2


def test_errors_name_the_tensor():
    n, k = 32, 64
    t, (q, scale, zp, _) = make_weight(n, k, 4, 32, symmetric=False)
    wp, zpp = t["weight_packed"], t["weight_zero_point"]
    with pytest.raises(ValueError, match="weight_packed"):
        k4.repack(k4.PackedWeight(wp[:, :4], scale, zpp, None, (n, k)))
    with pytest.raises(ValueError, match="weight_scale"):
        k4.repack(k4.PackedWeight(wp, scale[:, :1].repeat(1, 3), zpp, None, (n, k), 4, 32))
    with pytest.raises(ValueError, match="weight_zero_point"):
        k4.repack(k4.PackedWeight(wp, scale, zpp[:, :1], None, (n, k), 4, 32))
    with pytest.raises(ValueError, match="weight_g_idx"):
        k4.repack(k4.PackedWeight(wp, scale, zpp, torch.full((k,), 2, dtype=torch.int32), (n, k), 4, 32))
    with pytest.raises(ValueError, match="num_bits"):
        k4.repack(k4.PackedWeight(wp, scale, zpp, None, (n, k), 3, 32))
    w = k4.repack(k4.PackedWeight(wp, scale, zpp, None, (n, k), 4, 32))
    with pytest.raises(ValueError, match="x: last dimension 48"):
        k4.w4a16_gemm(torch.randn(2, 48).half(), w)
    with pytest.raises(ValueError, match="x: expected float16"):
        k4.w4a16_gemm(torch.randint(0, 3, (2, k)), w)
    with pytest.raises(ValueError, match="bias"):
        k4.w4a16_gemm(torch.randn(2, k).half(), w, torch.zeros(n + 1).half())


@settings(max_examples=10, deadline=None, derandomize=True)
@given(m=st.integers(1, 70), n=st.integers(1, 140), groups=st.integers(1, 4), group=st.sampled_from([32, 64, 128]),
       sym=st.booleans(), act_order=st.booleans(),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]))
def test_random_shapes(m, n, groups, group, sym, act_order, dtype):
    """Random shapes (derandomized: the same draws every run), both launch paths."""
    k = groups * group
    t, (q, scale, zp, args) = make_weight(n, k, 4, group, sym, act_order, dtype, seed=m * n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
    ref = k4.w4a16_reference(x, k4.PackedWeight(t["weight_packed"], scale, t["weight_zero_point"], t["weight_g_idx"],
                                                (n, k), 4, group))
    w = k4.repack(k4.PackedWeight(*(v.to(DEVICE) if torch.is_tensor(v) else v for v in (
        t["weight_packed"], scale, t["weight_zero_point"], t["weight_g_idx"])), (n, k), 4, group))
    out = k4.w4a16_gemm(x.to(DEVICE), w)
    assert rel_err(out, ref) < REL_TOL[dtype]
