"""FP8 blocks, MXFP8, W4AFP8, W4A8 and 2-7-bit int weights: quantkit's tensors against
compressed-tensors' own compressors, byte for byte.

Each preset's weight is quantized by quantkit (RTN, min-max) and by compressed-tensors
(its ``calculate_qparams`` on the same ranges, then the compressor of the format), on a random
linear and on real SmolLM2 weights; every tensor written must be identical in dtype, shape and
bytes.
"""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.compressors import BaseCompressor
from compressed_tensors.compressors.format import infer_module_format
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from safetensors import safe_open

from quantkit.config.scheme import PRESETS
from quantkit.formats.compressed_tensors import compress_module, decompress_module
from quantkit.numerics.primitives import quantize_weight

PRESET_NAMES = ["FP8_BLOCK", "MXFP8", "MXFP8A16", "W4AFP8", "W4A8", "W2A16", "W3A16", "W5A16", "W6A16", "W7A16"]
#: compressed-tensors infers int-quantized for int weights under fp8 activations; llm-compressor
#: writes W4AFP8 pack-quantized and vLLM's W4A8-FP8 scheme reads ``weight_packed``: quantkit
#: writes that, with the format named in the config group.
FORMAT_OVERRIDE = {"W4AFP8": "pack-quantized"}


def _ranges(w: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-scale min and max as compressed-tensors' observers reduce them (written out here,
    independently of quantkit's reductions)."""
    if args.strategy == "block":
        r, c = args.block_structure
        t = w.unfold(0, r, r).unfold(1, c, c)            # [out // r, in // c, r, c]
        return t.amin(dim=(-2, -1)), t.amax(dim=(-2, -1))
    if args.strategy == "group":
        g = w.unflatten(-1, (-1, args.group_size))
        return g.amin(dim=-1), g.amax(dim=-1)
    return w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)


def _theirs(w: torch.Tensor, preset: str) -> dict[str, torch.Tensor]:
    scheme = preset_name_to_scheme(preset, ["Linear"])
    lo, hi = _ranges(w, scheme.weights)
    scale, zp = calculate_qparams(lo, hi, scheme.weights)
    fmt = FORMAT_OVERRIDE.get(preset) or infer_module_format(torch.nn.Linear, scheme).value
    state = {"weight": w, "weight_scale": scale, "weight_zero_point": zp}
    return dict(BaseCompressor.get_value_from_registry(fmt).compress(state, scheme))


def _ours(w: torch.Tensor, preset: str) -> dict[str, torch.Tensor]:
    scheme = PRESETS[preset]
    q, scale, zp = quantize_weight(w, scheme.weights)
    return compress_module(q, scale, zp, None, scheme)


def _assert_identical(ours: dict, theirs: dict) -> None:
    assert sorted(ours) == sorted(theirs)
    for k in ours:
        a, b = ours[k], theirs[k]
        assert a.dtype == b.dtype and a.shape == b.shape, (k, a.dtype, b.dtype, a.shape, b.shape)
        assert torch.equal(a.view(torch.uint8) if a.dtype.itemsize == 1 else a,
                           b.view(torch.uint8) if b.dtype.itemsize == 1 else b), k


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_format_is_compressed_tensors_inferred_format(preset):
    theirs = infer_module_format(torch.nn.Linear, preset_name_to_scheme(preset, ["Linear"])).value
    assert PRESETS[preset].format == FORMAT_OVERRIDE.get(preset, theirs)


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_random_linear_bit_identical(preset):
    torch.manual_seed(0)
    w = torch.randn(256, 512) * torch.logspace(-3, 1, 512)   # columns over four decades: varied scales
    w[:128, :128] = 0.0                                       # an all-zero block / group
    ours = _ours(w, preset)
    _assert_identical(ours, _theirs(w, preset))
    # the decoded weight carries the error of its grid: each int bit halves it; fp8 E4M3 keeps
    # 3 mantissa bits
    back = decompress_module(ours, PRESETS[preset])
    rel = float((back - w).norm() / w.norm())
    args = PRESETS[preset].weights
    lo, hi = (0.01, 0.04) if args.type == "float" else (2.0 ** (1 - args.num_bits), 1.5 * 2.0 ** (1 - args.num_bits))
    assert lo < rel < hi


SMOLLM2_LINEARS = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                   "model.layers.1.mlp.down_proj", "model.layers.29.mlp.gate_proj"]


@pytest.mark.parametrize("preset", PRESET_NAMES)
def test_smollm2_weights_bit_identical(smollm2_dir, preset):
    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        weights = [f.get_tensor(f"{n}.weight").float() for n in SMOLLM2_LINEARS]
    args = PRESETS[preset].weights
    for w in weights:
        if args.strategy == "block" or args.group_size == 128:
            # SmolLM2's widths (576) are not multiples of 128: quantkit refuses those, so the
            # comparison runs on the largest 128-aligned corner of the real weight
            w = w[: w.shape[0] // 128 * 128, : w.shape[1] // 128 * 128].contiguous()
        _assert_identical(_ours(w, preset), _theirs(w, preset))
