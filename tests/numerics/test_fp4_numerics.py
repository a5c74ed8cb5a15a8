"""FP4 numerics against compressed-tensors' own functions (the reference vLLM and transformers use)."""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.compressors.mx_utils import compress_mx_scale
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.lifecycle.forward import fake_quantize
from compressed_tensors.quantization.utils.fp4_utils import cast_to_fp4
from compressed_tensors.quantization.utils.helpers import (calculate_qparams, compute_dynamic_scales_and_zp,
                                                           generate_gparam)
from compressed_tensors.quantization.utils.mxfp_utils import generate_mx_scales

from quantkit.numerics.e8m0 import exponent_to_scale, scale_exponent
from quantkit.numerics.fp4_numerics import (E2M1_GRID, e2m1_values, fake_quantize_fp4_input, quantize_fp4_weight,
                                   round_to_e2m1)


def _weights(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 256, generator=g) * torch.exp(torch.randn(64, 1, generator=g))
    w[0, :32] = 0            # an all-zero group: the scale floor
    w[1, :16] = 1e-6         # a group whose FP8 scale underflows to 0
    return w.to(dtype)


def test_e2m1_rounding_matches_cast_to_fp4_ties_included():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 0.2500001, 4.9999])
    x = torch.cat([ties, -ties, torch.randn(20000) * 3, torch.tensor([0.0, -0.0, -0.1])])
    want = cast_to_fp4(x.clone().clamp(-6, 6))
    got = e2m1_values(round_to_e2m1(x))
    assert torch.equal(got, want)
    # the sign bit: set below zero only, as compressed-tensors' packer codes -0.1 (8) and -0.0 (0)
    assert round_to_e2m1(torch.tensor([-0.1, -0.0, 0.1])).tolist() == [8, 0, 0]
    assert e2m1_values(torch.arange(8, dtype=torch.uint8)).tolist() == list(E2M1_GRID)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_e8m0_codes_match_generate_mx_scales(dtype):
    g = torch.Generator().manual_seed(1)
    amax = torch.rand(50000, generator=g) * torch.exp2(torch.randint(-140, 40, (50000,), generator=g).float())
    amax = torch.cat([amax, torch.tensor([0.0, 1.75, 1.7499, 3.5, 6.0, 7.0, 1e-30])]).to(dtype)
    want = generate_mx_scales(amax.clone(), 4).float().clamp(0, 255).round().to(torch.uint8)
    got = scale_exponent(amax, emax=2)
    assert torch.equal(got, want)
    assert torch.equal(exponent_to_scale(got).double(), torch.exp2(got.double() - 127))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nvfp4_global_then_group_scales_match(dtype):
    w = _weights(dtype)
    args = preset_name_to_scheme("NVFP4A16", ["Linear"]).weights
    gs = generate_gparam(w.amin(), w.amax())
    wg = w.unflatten(-1, (-1, 16))
    scale, _ = calculate_qparams(wg.amin(-1), wg.amax(-1), args, global_scale=gs)
    ours = quantize_fp4_weight(w, "nvfp4")
    assert torch.equal(ours.global_scale, gs)
    assert torch.equal(ours.scale.float(), scale) and ours.scale.dtype == torch.float8_e4m3fn
    assert ours.scale[1, 0].item() == 0.125   # underflowed to 0, replaced by the floor


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_scales_match(dtype):
    w = _weights(dtype, seed=2)
    args = preset_name_to_scheme("MXFP4A16", ["Linear"]).weights
    wg = w.unflatten(-1, (-1, 32))
    scale, _ = calculate_qparams(wg.amin(-1), wg.amax(-1), args)
    assert torch.equal(quantize_fp4_weight(w, "mxfp4").scale, compress_mx_scale(scale, torch.uint8))


@pytest.mark.parametrize("preset,kind", [("NVFP4", "nvfp4"), ("MXFP4", "mxfp4")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activation_fake_quant_matches(preset, kind, dtype):
    """Dynamic group scales per token (under NVFP4's static global input scale), as
    compressed-tensors' forward computes them."""
    x = (torch.randn(3, 5, 256, generator=torch.Generator().manual_seed(3)) * 3).to(dtype)
    args = preset_name_to_scheme(preset, ["Linear"]).input_activations
    gs = generate_gparam(x.amin(), x.amax()) if kind == "nvfp4" else None
    scale, zp = compute_dynamic_scales_and_zp(x, args, None, global_scale=gs)
    want = fake_quantize(x, scale, zp, args, global_scale=gs)
    got = fake_quantize_fp4_input(x, kind, gs)
    assert got.dtype == dtype and torch.equal(got, want)
