"""FP4 checkpoints hold exactly what compressed-tensors' compressors write for the same weights.

The reference: compressed-tensors computes the scales (``generate_gparam``, ``calculate_qparams``)
and its ``NVFP4PackedCompressor`` / ``MXFP4PackedCompressor`` pack the weight; quantkit's
checkpoint, written by its whole pipeline with RTN, must hold the same bytes. Linears that read
one input (q/k/v, gate/up) share the smallest of their NVFP4 weight global scales, as
llm-compressor shares it for vLLM's fused linears.
"""

from __future__ import annotations

import json

import pytest
import torch
from compressed_tensors.compressors.base import BaseCompressor
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
from safetensors.torch import load_file

import quantkit
from quantkit.config.scheme import PRESETS
from quantkit.evaluation.footprint import checkpoint_bits
from quantkit.serving.memory_account import FIXED_GROUPS, plan

from model_factory import random_ids

SCHEMES = {"NVFP4A16": "nvfp4-pack-quantized", "NVFP4": "nvfp4-pack-quantized",
           "MXFP4A16": "mxfp4-pack-quantized", "MXFP4": "mxfp4-pack-quantized"}
# SmolLM2: three layers are enough to cover every linear shape (576, 192, 1536 wide)
SMOLLM2_TARGETS = ["re:model\\.layers\\.[0-2]\\..*_proj$"]
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fused_global_scale(source: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """The NVFP4 weight global scale of ``module``: the smallest of its fused siblings'."""
    parent, _, leaf = module.rpartition(".")
    siblings = next((f for f in FUSED if leaf in f), (leaf,))
    ws = [source[f"{parent}.{n}.weight"] for n in siblings if f"{parent}.{n}.weight" in source]
    return torch.stack([generate_gparam(w.amin(), w.amax()) for w in ws]).amin(dim=0)


def reference_tensors(w: torch.Tensor, preset: str, gs: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """One linear's tensors as compressed-tensors quantizes (RTN, min-max) and compresses it."""
    scheme = preset_name_to_scheme(preset, ["Linear"])
    args = scheme.weights
    wg = w.unflatten(-1, (-1, args.group_size))
    state = {"weight": w}
    if gs is not None:
        state["weight_global_scale"] = gs
    state["weight_scale"], _ = calculate_qparams(wg.amin(-1), wg.amax(-1), args, global_scale=gs)
    compressor = BaseCompressor.get_value_from_registry(SCHEMES[preset])
    return compressor.compress(state, scheme)


def _checkpoint(path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def assert_bit_identical(source: dict[str, torch.Tensor], written: dict[str, torch.Tensor], preset: str) -> int:
    """Every quantized linear of ``written`` against the reference on its source weight."""
    n = 0
    for key in [k for k in written if k.endswith(".weight_packed")]:
        module = key[: -len(".weight_packed")]
        gs = fused_global_scale(source, module) if preset.startswith("NV") else None
        want = reference_tensors(source[f"{module}.weight"], preset, gs)
        for name in ("weight_packed", "weight_scale", "weight_global_scale"):
            if name in want:
                got = written[f"{module}.{name}"]
                assert got.dtype == want[name].dtype and got.shape == want[name].shape, (module, name)
                assert torch.equal(got.view(torch.uint8), want[name].contiguous().view(torch.uint8)), (module, name)
            else:
                assert f"{module}.{name}" not in written, (module, name)
        n += 1
    return n


@pytest.fixture(scope="module")
def tiny_fp4(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("fp4")
    return {p: quantkit.quantize(tiny_llama, {"scheme": p}, calibration=random_ids(4, 32)).save(root / p)
            for p in SCHEMES}


@pytest.mark.parametrize("preset", sorted(SCHEMES))
def test_tiny_model_bit_identical_to_compressor(tiny_fp4, tiny_llama, preset):
    source = _checkpoint(tiny_llama)
    written = _checkpoint(tiny_fp4[preset])
    assert assert_bit_identical(source, written, preset) == 14   # 2 layers x 7 linears
    if preset.startswith("NV"):   # one global scale per fused linear, not one per projection
        for f in FUSED:
            names = [f"model.layers.0.{'self_attn' if 'q_proj' in f else 'mlp'}.{n}" for n in f]
            scales = {written[f"{m}.weight_global_scale"].item() for m in names}
            own = {generate_gparam(source[f"{m}.weight"].amin(), source[f"{m}.weight"].amax()).item() for m in names}
            assert len(scales) == 1 and len(own) == len(f) and scales == {min(own)}
    assert "lm_head.weight" not in written or written["lm_head.weight"].dtype == torch.float32


@pytest.mark.parametrize("preset", sorted(SCHEMES))
def test_config_block_and_input_scales(tiny_fp4, preset):
    qc = json.loads((tiny_fp4[preset] / "config.json").read_text())["quantization_config"]
    assert qc["format"] == SCHEMES[preset]
    group = qc["config_groups"]["group_0"]
    theirs = preset_name_to_scheme(preset, ["Linear"]).model_dump(mode="json")
    for part in ("weights", "input_activations"):
        if theirs[part] is None:
            assert group[part] is None
            continue
        keys = ("num_bits", "type", "symmetric", "group_size", "strategy", "dynamic", "scale_dtype")
        assert {k: group[part][k] for k in keys} == {k: theirs[part][k] for k in keys}, part
    written = _checkpoint(tiny_fp4[preset])
    globals_in = [k for k in written if k.endswith(".input_global_scale")]
    # NVFP4 activations: a calibrated global input scale per linear (448 * 6 / the inputs' amax)
    assert len(globals_in) == (14 if preset == "NVFP4" else 0)
    assert all(written[k].dtype == torch.float32 and 0 < written[k].item() < float("inf") for k in globals_in)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["NVFP4A16", "MXFP4A16"])
def test_smollm2_layers_bit_identical_to_compressor(smollm2_dir, tmp_path, preset):
    recipe = {"config_groups": {"group_0": {"targets": SMOLLM2_TARGETS, **_scheme_dict(preset)}},
              "ignore": ["lm_head"], "algorithm": {"name": "rtn"}}
    out = quantkit.quantize(smollm2_dir, recipe).save(tmp_path / preset)
    assert assert_bit_identical(_checkpoint(smollm2_dir), _checkpoint(out), preset) == 3 * 7


def _scheme_dict(preset: str) -> dict:
    d = PRESETS[preset].to_dict()
    return {"weights": {k: d["weights"][k] for k in ("num_bits", "type", "symmetric", "group_size", "strategy")}}


@pytest.mark.parametrize("preset", sorted(SCHEMES))
def test_plan_names_the_checkpoint_format(tiny_fp4, preset):
    """The evaluation's deployment footprint reads an FP4 checkpoint as its format (4 bits, the
    format's own groups and 1-byte scales), not as FP8."""
    kind = SCHEMES[preset].split("-")[0]
    assert checkpoint_bits(tiny_fp4[preset]) == kind
    # 2 layers x (q, o: 64 x 64; k, v: 32 x 64; gate, up, down: 128 x 64) weights, one scale byte a group
    assert plan(tiny_fp4[preset], weights=kind).scale_bytes == 2 * 36864 // FIXED_GROUPS[kind][0]
