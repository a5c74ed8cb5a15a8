"""FP8 blocks, MXFP8, W4AFP8, W4A8 and odd int widths read back: ``quantkit.load`` (the torch
reference path, activations quantized as the scheme says) against compressed-tensors.

transformers + compressed-tensors load these checkpoints themselves, except MXFP8: compressed-
tensors 0.20 decodes MX weights to bfloat16 whatever the model's dtype, and a float32 model then
fails in its first matmul. For MX the reference is built from compressed-tensors' own parts in
float32: its MXFP8 decompressor for the weights and its activation quantizer on the inputs.
"""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.compressors import BaseCompressor
from compressed_tensors.quantization import QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import forward_quantize
from compressed_tensors.quantization.quant_config import QuantizationStatus
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import quantkit
import quantkit.config.scheme

from model_factory import make_llama_dir, random_ids

RECIPES = {"FP8_BLOCK": {"scheme": "FP8_BLOCK"}, "W4AFP8": {"scheme": "W4AFP8"}, "W4A8": {"scheme": "W4A8"},
           "W3A16": {"scheme": "W3A16", "group_size": 64}, "W5A16": {"scheme": "W5A16"},
           "MXFP8": {"scheme": "MXFP8"}, "MXFP8A16": {"scheme": "MXFP8A16"},
           "w3a16-g64-gptq": "w3a16-g64-gptq", "w4a8-gptq": {"scheme": "W4A8", "algorithm": "gptq"}}
#: compressed-tensors scales int8 activations per token by absmax / 127.5 (its int range 255 / 2),
#: vLLM's kernels and quantkit by absmax / 127: W4A8's logits differ by that rounding (2.8% of
#: the logits' norm measured on this model); every other scheme computes the same numbers.
TOLERANCE = {"W4A8": 0.05, "w4a8-gptq": 0.05}
IDS = [torch.tensor(random_ids(1, 12, seed=s)) for s in (3, 11)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocks")
    # widths that 128 divides: the FP8 block and W4A8 group sizes
    src = make_llama_dir(root / "src", hidden=256, intermediate=512, vocab=256)
    calib = random_ids(4, 32)
    return {name: quantkit.quantize(src, rec, calibration=calib if "gptq" in name else None).save(root / name)
            for name, rec in RECIPES.items()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _mx_reference(path, src) -> torch.nn.Module:
    """The source architecture with each quantized linear decoded by compressed-tensors' MXFP8
    decompressor and its inputs quantized by compressed-tensors' activation quantizer."""
    import json

    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    state = load_file(str(path / "model.safetensors"))
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.Linear) or name == "lm_head":
            continue
        scheme = QuantizationScheme.model_validate(qc["config_groups"]["group_0"])
        tensors = {k.removeprefix(name + "."): v for k, v in state.items() if k.startswith(name + ".")}
        decoded = BaseCompressor.get_value_from_registry(qc["format"]).decompress(tensors, scheme)["weight"]
        m.weight.data = decoded.float()
        if scheme.input_activations is not None:
            m.quantization_status = QuantizationStatus.CALIBRATION
            m.register_forward_pre_hook(lambda mod, a, s=scheme: (forward_quantize(mod, a[0], "input", s.input_activations),))
    return model


@pytest.mark.parametrize("preset", sorted(RECIPES))
def test_logits_equal_the_reference_reader(checkpoints, preset):
    path = checkpoints[preset]
    ours = quantkit.load(path)
    if preset.startswith("MXFP8"):
        theirs = _mx_reference(path, path.parent / "src")
    else:
        theirs = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        for ids in IDS:
            assert _rel(ours(ids).logits, theirs(ids).logits) <= TOLERANCE.get(preset, 1e-5)


@pytest.mark.parametrize("preset", ["FP8_BLOCK", "W4AFP8", "MXFP8"])
def test_activation_quantization_is_in_the_evaluation_path(checkpoints, preset):
    """The same weights with float activations give other logits: both readers quantize the
    activations, and the agreement above is not two readers skipping it alike."""
    path = checkpoints[preset]
    model = quantkit.load(path)
    with torch.no_grad():
        quantized = model(IDS[0]).logits
        for m in model.modules():
            if hasattr(m, "scheme"):
                m.scheme = type(m.scheme)(m.scheme.targets, m.scheme.weights, None)
        float_acts = model(IDS[0]).logits
    assert _rel(quantized, float_acts) > 1e-3


#: (tensor, dtype, shape) of layer 0's down_proj [256, 512] in each checkpoint
LAYOUT = {"FP8_BLOCK": [("weight", torch.float8_e4m3fn, (256, 512)), ("weight_scale", torch.float32, (2, 4))],
          "MXFP8": [("weight", torch.float8_e4m3fn, (256, 512)), ("weight_scale", torch.uint8, (256, 16))],
          "W4AFP8": [("weight_packed", torch.int32, (256, 64)), ("weight_scale", torch.float32, (256, 4))],
          "W4A8": [("weight", torch.int8, (256, 512)), ("weight_scale", torch.float32, (256, 4))],
          "W3A16": [("weight_packed", torch.int32, (256, 48)), ("weight_scale", torch.float32, (256, 8))]}


@pytest.mark.parametrize("preset", sorted(LAYOUT))
def test_checkpoint_layout(checkpoints, preset):
    import json

    state = load_file(str(checkpoints[preset] / "model.safetensors"))
    prefix = "model.layers.0.mlp.down_proj."
    assert {k.removeprefix(prefix) for k in state if k.startswith(prefix)} >= {k for k, _, _ in LAYOUT[preset]}
    for key, dtype, shape in LAYOUT[preset]:
        assert (state[prefix + key].dtype, tuple(state[prefix + key].shape)) == (dtype, shape), key
    fmt = json.loads((checkpoints[preset] / "config.json").read_text())["quantization_config"]["format"]
    assert fmt == quantkit.config.scheme.PRESETS[preset].format


@pytest.mark.parametrize("preset", ["MXFP8", "FP8_BLOCK", "W4AFP8", "W3A16"])
def test_triton_falls_back_to_the_reference_with_a_warning(checkpoints, preset):
    """No Triton kernel computes these schemes: asking for it runs the reference, and says so."""
    from quantkit.runtime.loader import model_fallbacks

    model = quantkit.load(checkpoints[preset])
    layer = model.model.layers[0].mlp.down_proj
    layer.set_backend("triton")
    assert layer.backend == "torch"
    assert layer.format in layer.fallback and "torch reference" in layer.fallback
    assert model_fallbacks(model) == [layer.fallback]


def test_inspect_names_blocks_and_e8m0_scales(checkpoints):
    from typer.testing import CliRunner

    from quantkit.cli import app

    lines = {p: CliRunner().invoke(app, ["inspect", str(checkpoints[p])]).output for p in ("FP8_BLOCK", "MXFP8")}
    assert "weights float8 block 128x128  activations float8 group g128 dynamic" in lines["FP8_BLOCK"]
    assert "weights float8 group g32 e8m0  activations float8 group g32 e8m0 dynamic" in lines["MXFP8"]
