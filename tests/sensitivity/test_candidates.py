"""Candidate formats: what a recipe may name, and sizes equal to what the checkpoint holds."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.formats.compressed_tensors import compress_module
from quantkit.numerics.primitives import quantize_weight
from quantkit.config.scheme import QuantArgs, QuantScheme, fp4_kind, preset
from quantkit.formats.fp4_packed import compress_fp4_module
from quantkit.numerics.fp4_numerics import quantize_fp4_weight
from quantkit.sensitivity import bits_per_weight, candidate, candidates_from, weight_bytes

FORMATS = [
    QuantArgs(num_bits=4, group_size=32),
    QuantArgs(num_bits=4, group_size=64, symmetric=False),
    QuantArgs(num_bits=4, group_size=32, actorder="group"),
    QuantArgs(num_bits=8, strategy="channel"),
    QuantArgs(num_bits=8, strategy="channel", symmetric=False),
    QuantArgs(num_bits=2, group_size=64),
    QuantArgs(num_bits=8, type="float", strategy="channel"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("args", FORMATS, ids=lambda a: f"{a.type}{a.num_bits}-{a.strategy}-{a.symmetric}-{a.actorder}")
def test_bytes_are_what_the_format_writes(args, dtype):
    out, cols = 72, 192   # 72 rows: asymmetric zero points fill int32 words unevenly at 4 bits
    w = torch.randn(out, cols, dtype=dtype)
    q, scale, zp = quantize_weight(w, args)
    g_idx = torch.arange(cols, dtype=torch.int32) // args.group_size if args.actorder == "group" else None
    tensors = compress_module(q, scale, zp, g_idx, QuantScheme(("Linear",), args))
    assert weight_bytes(args, out, cols, dtype) == sum(t.numel() * t.element_size() for t in tensors.values())


def test_kept_costs_the_model_dtype_and_fp32_scales_make_w4_g64_cost_4_5():
    assert bits_per_weight(None, 10, 20, torch.float32) == 32.0
    assert bits_per_weight(None, 10, 20, torch.bfloat16) == 16.0
    w4 = candidate("W4_G64").weights
    assert bits_per_weight(w4, 576, 576, torch.float32) == pytest.approx(4.5, abs=1e-3)
    assert bits_per_weight(w4, 576, 576, torch.bfloat16) == pytest.approx(4.25, abs=1e-3)


def test_named_and_explicit_candidates_inherit_the_recipe_observer_and_actorder():
    base = QuantArgs(num_bits=4, group_size=64, observer="mse", actorder="weight")
    cands = candidates_from(["w4_g128", "W8_CHANNEL", {"name": "w3", "weights": {"num_bits": 2, "group_size": 32}},
                             "KEEP"], base, "mixed.candidates")
    assert [c.name for c in cands] == ["W4_G128", "W8_CHANNEL", "w3", "KEEP"]
    assert all(c.weights.observer == "mse" and c.weights.actorder == "weight" for c in cands[:3])
    assert cands[3].weights is None
    group = QuantArgs(num_bits=4, group_size=64, actorder="group")
    w8 = candidates_from(["W8_CHANNEL", "KEEP"], group, "c")[0]
    assert w8.weights.actorder is None   # activation order "group" needs groups


@pytest.mark.parametrize("spec,needle", [
    (["W5"], "mixed.candidates[0]: unknown candidate 'W5'"),
    (["W8_CHANNEL", "W8_CHANNEL"], "mixed.candidates: candidate 'W8_CHANNEL' is listed twice"),
    (["KEEP"], "mixed.candidates: a plan needs at least two candidates"),
    ([{"name": "x", "weights": {"num_bits": 9, "group_size": 32}}, "KEEP"], "int quantization supports 2..8 bits"),
    ([{"name": "x", "weigths": {}}, "KEEP"], "unknown key 'weigths'"),
])
def test_bad_candidates_are_one_line(spec, needle):
    with pytest.raises(QuantkitError) as e:
        candidates_from(spec, None, "mixed.candidates")
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("preset_name", ["NVFP4A16", "MXFP4A16"])
def test_fp4_bytes_are_what_the_format_writes(preset_name):
    """Two codes a byte, one byte per group scale, NVFP4's global scale: 4.5 and 4.25 bits a weight."""
    scheme = preset(preset_name)
    out, cols = 48, 96
    w = torch.randn(out, cols, generator=torch.Generator().manual_seed(0))
    tensors = compress_fp4_module(quantize_fp4_weight(w, fp4_kind(scheme.weights)), scheme)
    written = sum(t.numel() * t.element_size() for t in tensors.values())
    assert weight_bytes(scheme.weights, out, cols, torch.bfloat16) == written
    assert round(bits_per_weight(scheme.weights, 4096, 4096, torch.bfloat16), 2) == {"NVFP4A16": 4.5,
                                                                                     "MXFP4A16": 4.25}[preset_name]
