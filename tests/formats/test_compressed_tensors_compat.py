"""quantization_config as compressed-tensors (the reader vLLM and transformers use) sees it.

vLLM picks its kernel from the parsed config groups (weights / input_activations: num_bits,
type, symmetric, strategy, group_size, dynamic) and the format string; a drift in any of them
makes it refuse a checkpoint or run the wrong kernel. benchmarks/vllm_check.py is the end-to-end
proof (slow, opt-in); these tests pin the config to compressed-tensors' own presets.
"""

from __future__ import annotations

import compressed_tensors.quantization as ct_quant
import pytest

from quantkit.formats.compressed_tensors import quantization_config
from quantkit.config.scheme import PRESETS

FIELDS = ("num_bits", "type", "symmetric", "strategy", "group_size", "dynamic", "block_structure", "scale_dtype")
FORMAT = {"FP8_DYNAMIC": "float-quantized", "FP8": "float-quantized", "W8A8": "int-quantized",
          "W4A16": "pack-quantized", "FP8_BLOCK": "float-quantized", "MXFP8": "mxfp8-quantized",
          "MXFP8A16": "mxfp8-quantized", "W4AFP8": "pack-quantized", "W4A8": "int-quantized",
          "W3A16": "pack-quantized", "W5A16": "pack-quantized"}


def _value(x):
    return getattr(x, "value", x)  # compressed-tensors holds enums


@pytest.mark.parametrize("preset", sorted(FORMAT))
def test_config_parses_to_compressed_tensors_preset(preset):
    qc = quantization_config({"group_0": PRESETS[preset]}, ["lm_head"])
    parsed = ct_quant.QuantizationConfig.model_validate(qc)
    assert parsed.quant_method == "compressed-tensors"
    assert parsed.format == FORMAT[preset]
    assert parsed.ignore == ["lm_head"]
    ours = parsed.config_groups["group_0"]
    theirs = ct_quant.preset_name_to_scheme(preset, ["Linear"])
    assert ours.targets == ["Linear"]
    for part in ("weights", "input_activations"):
        a, b = getattr(ours, part), getattr(theirs, part)
        assert (a is None) == (b is None), part
        if a is not None:
            assert {f: _value(getattr(a, f)) for f in FIELDS} == {f: _value(getattr(b, f)) for f in FIELDS}, part
    assert ours.output_activations is None


@pytest.mark.parametrize("preset", ["FP8_DYNAMIC", "W8A8"])
def test_dynamic_activations_carry_no_observer(preset):
    """A dynamic per-token activation scheme stores no input scale and names no observer."""
    group = quantization_config({"g": PRESETS[preset]}, [])["config_groups"]["g"]
    acts = group["input_activations"]
    assert acts["dynamic"] is True and acts["strategy"] == "token" and acts["observer"] is None
    assert group["weights"]["strategy"] == "channel" and group["weights"]["dynamic"] is False
