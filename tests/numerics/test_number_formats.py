"""The number-format contract: every format's codes, scales and differentiable fake-quantization
agree with each other and with the math each format had before the contract."""

from __future__ import annotations

import pytest
import torch

from quantkit.config.scheme import QuantArgs
from quantkit.numerics.fp4_numerics import dequantize_fp4, quantize_fp4_weight
from quantkit.numerics.number_formats import FORMATS, Clip, format_name, number_format
from quantkit.numerics.primitives import dequantize, quantize_weight

ARGS = {
    "int4-g16-sym": QuantArgs(num_bits=4, group_size=16),
    "int4-g16-asym": QuantArgs(num_bits=4, group_size=16, symmetric=False),
    "int8-channel": QuantArgs(num_bits=8, strategy="channel"),
    "int3-g16-mse": QuantArgs(num_bits=3, group_size=16, observer="mse"),
    "fp8-channel": QuantArgs(num_bits=8, type="float", strategy="channel"),
    "nvfp4": QuantArgs(num_bits=4, type="float", group_size=16),
    "mxfp4": QuantArgs(num_bits=4, type="float", group_size=32),
}


def weight(dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 64, generator=g)
    w[:, 5] *= 6   # an outlier column
    return w.to(dtype)


def test_every_registered_format_has_cases_here():
    assert set(FORMATS) == {format_name(a) for a in ARGS.values()}
    assert [format_name(ARGS[k]) for k in ("int4-g16-sym", "fp8-channel", "nvfp4", "mxfp4")] == \
        ["int", "fp8", "nvfp4", "mxfp4"]


@pytest.mark.parametrize("key", [k for k in ARGS if format_name(ARGS[k]) in ("int", "fp8")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int_and_fp8_scales_and_codes_are_the_primitives(key, dtype):
    args, w = ARGS[key], weight(dtype)
    fmt = number_format(args)
    qp = fmt.scales(w)
    q, s, z = quantize_weight(w, args)
    assert torch.equal(fmt.quantize(w, qp).view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(qp.scale, s) and (z is None or torch.equal(qp.zero_point, z))
    assert torch.equal(fmt.dequantize(q, qp, dtype=dtype), dequantize(q, s, z, args, None, dtype))


@pytest.mark.parametrize("key", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp4_scales_and_codes_are_numerics_fp4(key, dtype):
    w = weight(dtype)
    fmt = number_format(ARGS[key])
    qp = fmt.scales(w)
    ref = quantize_fp4_weight(w, key)
    assert torch.equal(qp.scale.view(torch.uint8), ref.scale.view(torch.uint8))
    assert torch.equal(fmt.quantize(w, qp), ref.codes)
    assert torch.equal(fmt.dequantize(ref.codes, qp, dtype=dtype), dequantize_fp4(ref, key, dtype))


@pytest.mark.parametrize("key", list(ARGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fake_quantize_forward_is_the_codes_it_would_write(key, dtype):
    """With a clip and an offset, fake_quantize equals decoding the codes the same clip and
    offset write, bit for bit: what a learned-rounding step trains is what it stores."""
    args, w = ARGS[key], weight(dtype)
    fmt = number_format(args)
    g = torch.Generator().manual_seed(1)
    n_scales = fmt.scales(w).scale.shape
    clip = Clip(0.7 + 0.3 * torch.rand(n_scales, generator=g), 0.7 + 0.3 * torch.rand(n_scales, generator=g))
    offset = None if format_name(args) == "fp8" else torch.rand(w.shape, generator=g) - 0.5
    qp = fmt.range_scales(w, clip, None, None)
    want = fmt.dequantize(fmt.quantize(w, qp, offset=offset), qp, dtype=dtype)
    assert torch.equal(fmt.fake_quantize(w, offset, clip), want)
    plain = fmt.range_scales(w, Clip(), None, None)
    assert torch.equal(fmt.fake_quantize(w), fmt.dequantize(fmt.quantize(w, plain), plain, dtype=dtype))


@pytest.mark.parametrize("key", list(ARGS))
def test_fake_quantize_passes_gradients_to_weight_offset_and_clip(key):
    args, w = ARGS[key], weight().requires_grad_(True)
    fmt = number_format(args)
    n_scales = fmt.scales(w.detach()).scale.shape
    cmax = torch.full(n_scales, 0.9, requires_grad=True)
    cmin = torch.full(n_scales, 0.9, requires_grad=True)
    offset = None if format_name(args) == "fp8" else torch.zeros(w.shape, requires_grad=True)
    target = weight() * 1.01
    loss = (fmt.fake_quantize(w, offset, Clip(cmax, cmin)) - target).pow(2).sum()
    loss.backward()
    assert w.grad is not None and bool(w.grad.abs().sum() > 0)
    assert bool(cmax.grad.abs().sum() > 0)
    if not args.symmetric:
        assert bool(cmin.grad.abs().sum() > 0)
    if offset is not None:
        assert bool(offset.grad.abs().sum() > 0)


@pytest.mark.parametrize("key", ["int4-g16-sym", "int4-g16-asym", "nvfp4", "mxfp4"])
def test_offset_moves_codes_by_one_step_at_most(key):
    """An offset of +-0.49 rounds each code to a neighbour of its nearest grid point (or itself)."""
    fmt, w = number_format(ARGS[key]), weight()
    qp = fmt.scales(w)
    base = fmt.grid_values(fmt.quantize(w, qp)) if not fmt.affine else fmt.quantize(w, qp).float()
    up = fmt.grid_values(fmt.quantize(w, qp, offset=torch.full(w.shape, 0.49))) if not fmt.affine \
        else fmt.quantize(w, qp, offset=torch.full(w.shape, 0.49)).float()
    assert bool((up >= base).all())
    assert bool((up > base).any())


@pytest.mark.parametrize("key", ["int4-g16-sym", "nvfp4", "mxfp4"])
def test_column_grid_rounds_as_the_codes(key):
    """GPTQ's column grid (step, round_to_grid, grid_values) gives the codes ``quantize`` gives."""
    fmt, w = number_format(ARGS[key]), weight()
    qp = fmt.scales(w)
    step = fmt.step(qp).repeat_interleave(fmt.group_size, dim=-1)
    codes = fmt.round_to_grid(w.float() / step)
    assert torch.equal(codes.to(fmt.quantize(w, qp).dtype), fmt.quantize(w, qp))
    assert torch.equal(fmt.grid_values(codes) * step, fmt.dequantize(fmt.quantize(w, qp), qp).float())
