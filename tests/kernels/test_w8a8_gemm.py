"""FP8 and INT8 W8A8 kernels and the fused activation quantizer vs the torch references."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_testing import DEVICE, REL_TOL, rel_err
from quantkit.kernels import act_quant, fp8_gemm, int8_gemm, reference
from quantkit.numerics.primitives import quantize_weight
from quantkit.config.scheme import QuantArgs

GEMMS = {"fp8": (fp8_gemm.fp8_gemm, fp8_gemm.fp8_gemm_reference),
         "int8": (int8_gemm.int8_gemm, int8_gemm.int8_gemm_reference)}


def make_weight(kind, n, k, per_channel=True, dtype=torch.float32, seed=0):
    """A random weight quantized by the spine's primitives (what the checkpoint holds)."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
    args = QuantArgs(num_bits=8, type="float" if kind == "fp8" else "int",
                     strategy="channel" if per_channel else "tensor")
    q, scale, _ = quantize_weight(w, args)
    return q, scale


def activations(m, k, dtype, seed=1):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed))
    x[:, :3] *= 20  # outlier channels, as in real activations
    return x.to(dtype)


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_activation_codes_equal_the_torch_backend(kind, dtype):
    """The fused per-token kernel gives the torch backend's codes and scales bit for bit."""
    x = activations(13, 1500, dtype)  # more than one 1024-wide block per row
    x[4] = 0  # an all-zero token takes the minimum scale
    x[5, 7] = float(torch.finfo(dtype).max) / 4 if dtype != torch.float32 else 1e30
    x[6] = 1e-9  # a tiny token: the scale floor decides
    codes, scale = act_quant.quantize_activations(x.to(DEVICE), kind)
    ref_codes, ref_scale = reference._act_codes(x, SimpleNamespace(input_scale=None), float_type=kind == "fp8")
    assert torch.equal(act_quant.quantize_activations_reference(x, kind)[1], ref_scale)
    assert torch.equal(scale.cpu(), ref_scale)
    # equal values (the interpreter's cast writes -0.0 as +0.0, which no product can see)
    assert torch.equal(codes.cpu().float(), ref_codes.float())


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_activation_codes_rounding_edges(kind):
    """Ties, binade carries (the interpreter's fp8 cast drops them) and subnormals."""
    limit = act_quant.LIMIT[kind]
    vals = torch.tensor([limit, 0.5, 1.5, 2.5, -2.5, 127.9, 31.99, -7.97, 239.0, 447.0, 3e-3, -1.2e-3,
                         2.0**-6, 2.0**-6 - 2.0**-11, 0.0, 1e-8])
    x = vals.repeat(3, 1)
    x[1] *= 0.25
    static = torch.tensor([1.0])
    for scale in (None, static):
        codes, _ = act_quant.quantize_activations(x.to(DEVICE), kind, scale)
        ref, _ = act_quant.quantize_activations_reference(x, kind, scale)
        assert torch.equal(codes.cpu().float(), ref.float()), (codes, ref)


CASES = [  # m, n, k, dtype, per_channel, static, bias
    (1, 96, 256, torch.bfloat16, True, False, False),
    (7, 130, 200, torch.float16, True, False, True),
    (33, 64, 320, torch.bfloat16, False, True, False),
    (40, 100, 128, torch.float32, True, True, True),
    (16, 72, 136, torch.float16, False, False, False),
]


@pytest.mark.parametrize("kind", ["int8", "fp8"])
@pytest.mark.parametrize("m,n,k,dtype,per_channel,static,bias", CASES)
def test_matches_reference(kind, m, n, k, dtype, per_channel, static, bias):
    gemm, reference = GEMMS[kind]
    wq, ws = make_weight(kind, n, k, per_channel, dtype, seed=m)
    x = activations(m, k, dtype)
    b = torch.randn(n).to(dtype) if bias else None
    input_scale = (x.float().abs().amax() / act_quant.LIMIT[kind]).reshape(1) if static else None
    ref = reference(x, wq, ws, input_scale, b)
    out = gemm(x.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE), None if input_scale is None else input_scale.to(DEVICE),
               None if b is None else b.to(DEVICE))
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out, ref) < REL_TOL[dtype], rel_err(out, ref)
    # and the quantized product is close to the float one (the scheme's own error, not the kernel's)
    w_float = wq.float() * ws.float().reshape(-1, 1)
    dense = x.float() @ w_float.t() + (b.float() if bias else 0)
    assert rel_err(out, dense) < 0.1  # catches a wrong scale convention shared by both


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_gemm_alone_on_torch_codes(kind):
    """The GEMM and epilogue given the reference's activation codes (no kernel quantizer)."""
    n, k = 80, 192
    wq, ws = make_weight(kind, n, k)
    x = activations(21, k, torch.float32)
    codes, scales = act_quant.quantize_activations_reference(x, kind)
    mod = fp8_gemm if kind == "fp8" else int8_gemm
    problem = fp8_gemm.ScaledProblem(codes.to(DEVICE), wq.to(DEVICE), scales.reshape(-1).to(DEVICE),
                                     ws.reshape(-1).float().to(DEVICE))
    out = fp8_gemm.scaled_gemm(mod.KERNEL, problem, torch.float32, DEVICE == "cpu", mod.INTERPRET_CONFIG)
    ref = (codes.double() @ wq.double().t()) * scales.double() * ws.double().reshape(1, -1)
    assert rel_err(out, ref) < 1e-6


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_weight_only_and_dynamic_tensor(kind):
    gemm, reference = GEMMS[kind]
    n, k = 48, 160
    wq, ws = make_weight(kind, n, k, dtype=torch.float16)
    x = activations(5, k, torch.float16)
    out = gemm(x, wq, ws, input_quant=None)
    ref = reference(x, wq, ws, input_quant=None)
    assert rel_err(out, ref) < REL_TOL[torch.float16]
    # dynamic per-tensor: one scale from the whole batch, same as a static scale of that value
    scale = (x.float().abs().amax() / act_quant.LIMIT[kind]).reshape(1)
    tensor = act_quant.InputQuant(dynamic=True, strategy="tensor")
    out = gemm(x, wq, ws, input_quant=tensor)
    assert rel_err(out, reference(x, wq, ws, scale)) < REL_TOL[torch.float16]
    # the reference given the same options agrees with itself given that scale
    assert torch.equal(reference(x, wq, ws, input_quant=tensor), reference(x, wq, ws, scale))


@pytest.mark.parametrize("kind", ["int8", "fp8"])
def test_every_autotune_config(kind):
    mod = fp8_gemm if kind == "fp8" else int8_gemm
    n, k = 72, 256
    wq, ws = make_weight(kind, n, k)
    x = activations(20, k, torch.float32)
    codes, scales = act_quant.quantize_activations_reference(x, kind)
    ref = (codes.double() @ wq.double().t()) * scales.double() * ws.double().reshape(1, -1)
    for c in mod.CONFIGS:
        cfg = dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
        problem = fp8_gemm.ScaledProblem(codes, wq, scales.reshape(-1), ws.reshape(-1).float())
        out = fp8_gemm.scaled_gemm(mod.KERNEL, problem, torch.float32, True, cfg)
        assert rel_err(out, ref) < 1e-6, c


def test_errors_name_the_tensor():
    wq, ws = make_weight("int8", 32, 64)
    x = torch.randn(3, 64)
    with pytest.raises(ValueError, match="x: last dimension 48"):
        int8_gemm.int8_gemm(torch.randn(3, 48), wq, ws)
    with pytest.raises(ValueError, match="weight: expected a 2-D torch.int8"):
        int8_gemm.int8_gemm(x, wq.float(), ws)
    with pytest.raises(ValueError, match="weight: expected a 2-D torch.float8_e4m3fn"):
        fp8_gemm.fp8_gemm(x, wq, ws)
    with pytest.raises(ValueError, match="weight_scale"):
        int8_gemm.int8_gemm(x, wq, ws[:5])
    with pytest.raises(ValueError, match="input_scale"):
        int8_gemm.int8_gemm(x, wq, ws, torch.ones(2))
    with pytest.raises(ValueError, match="input_scale: static"):
        int8_gemm.int8_gemm(x, wq, ws, input_quant=act_quant.InputQuant(dynamic=False))
    with pytest.raises(ValueError, match="input_strategy"):
        int8_gemm.int8_gemm(x, wq, ws, input_quant=act_quant.InputQuant(strategy="channel"))
    with pytest.raises(ValueError, match="bias"):
        int8_gemm.int8_gemm(x, wq, ws, bias=torch.zeros(3))
    with pytest.raises(ValueError, match="x: expected float16"):
        int8_gemm.int8_gemm(x.long(), wq, ws)


@settings(max_examples=10, deadline=None, derandomize=True)
@given(kind=st.sampled_from(["int8", "fp8"]), m=st.integers(1, 70), n=st.integers(1, 140), k=st.integers(1, 300),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]), per_channel=st.booleans(),
       static=st.booleans())
def test_random_shapes(kind, m, n, k, dtype, per_channel, static):
    """Random shapes (derandomized: the same draws every run), any K."""
    gemm, reference = GEMMS[kind]
    wq, ws = make_weight(kind, n, k, per_channel, dtype, seed=m + n + k)
    x = activations(m, k, dtype)
    input_scale = torch.tensor([0.05]) if static else None
    ref = reference(x, wq, ws, input_scale)
    out = gemm(x.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE), None if input_scale is None else input_scale.to(DEVICE))
    assert rel_err(out, ref) < REL_TOL[dtype]
