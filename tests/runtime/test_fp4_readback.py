"""FP4 checkpoints read back: quantkit.load's torch reference (FP4 and E8M0 dequantization, FP4
activations emulated) against transformers + compressed-tensors on the same files.

compressed-tensors decompresses FP4 weights to bfloat16 (its unpacker's dtype), so the two
readers compute identically only in a bfloat16 model: there the logits must be equal. In a
float32 model transformers cannot run the bfloat16 weights it decompressed, so the float32
check compares quantkit.load with the weights compressed-tensors decompresses, rounded to
bfloat16 only by that reader.
"""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.compressors.base import BaseCompressor
from compressed_tensors.quantization import preset_name_to_scheme
from transformers import AutoModelForCausalLM

import quantkit
from quantkit.kernels import backend_for_format, collecting_fallbacks
from quantkit.runtime.modules import QuantLinear

from model_factory import make_llama_dir, random_ids

PRESETS = ("NVFP4A16", "NVFP4", "MXFP4A16", "MXFP4")
RECIPES = {**{p: {"scheme": p} for p in PRESETS},
           "NVFP4A16-GPTQ": {"scheme": "NVFP4A16", "algorithm": {"name": "gptq", "block_size": 32}},
           "MXFP4-GPTQ": {"scheme": "MXFP4", "algorithm": {"name": "gptq", "block_size": 32}}}


@pytest.fixture(scope="module")
def bf16_fp4(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp4bf16")
    src = make_llama_dir(root / "f32", seed=4)
    AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).save_pretrained(root / "bf16")
    out = {p: quantkit.quantize(root / "bf16", r, calibration=random_ids(4, 32)).save(root / p)
           for p, r in RECIPES.items()}
    return root / "bf16", out


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float()


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("preset", list(RECIPES))
def test_transformers_compressed_tensors_equal_in_bf16(bf16_fp4, preset):
    src, out = bf16_fp4
    ids = random_ids(2, 16, seed=8)
    model = quantkit.load(out[preset])
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 14
    ours = _logits(model, ids)
    theirs = _logits(AutoModelForCausalLM.from_pretrained(out[preset]), ids)
    assert _rel(ours, theirs) <= 1e-6
    # and FP4 is not a no-op: the logits moved from the bf16 model's
    assert _rel(ours, _logits(AutoModelForCausalLM.from_pretrained(src), ids)) > 0.01


@pytest.mark.parametrize("preset", ["NVFP4A16", "MXFP4A16"])
def test_float32_weights_match_the_reference_decompression(tiny_llama, tmp_path, preset):
    """float32 model: quantkit.load's dequantized weights equal compressed-tensors' decompressed
    ones up to that reader's bfloat16 rounding (relative 2**-8 per element)."""
    path = quantkit.quantize(tiny_llama, {"scheme": preset}).save(tmp_path / preset)
    model = quantkit.load(path)
    compressor = BaseCompressor.get_value_from_registry(model.quantkit_info["format"])
    scheme = preset_name_to_scheme(preset, ["Linear"])
    n = 0
    for m in model.modules():
        if isinstance(m, QuantLinear):
            state = {k: v for k, v in m.state_dict().items() if k.startswith("weight_")}
            theirs = compressor.decompress(state, scheme)["weight"]
            ours = m(torch.eye(m.in_features)).T          # the layer's weight, through its forward
            assert theirs.dtype == torch.bfloat16
            assert torch.equal(ours.to(torch.bfloat16), theirs)
            n += 1
    assert n == 14


def test_a_default_backend_without_an_fp4_kernel_falls_back_to_the_reference_with_a_reason():
    """On CUDA the default is triton, which has no FP4 kernel: the torch reference runs the FP4
    formats, said in the log and the report; a backend asked for by name is not replaced."""
    with collecting_fallbacks() as seen:
        assert backend_for_format("nvfp4-pack-quantized", "triton", explicit=False) == "torch"
    assert any("no kernel for nvfp4-pack-quantized" in r for r in seen)
    assert backend_for_format("nvfp4-pack-quantized", "triton", explicit=True) == "triton"
    assert backend_for_format("nvfp4-pack-quantized", "torch", explicit=False) == "torch"
