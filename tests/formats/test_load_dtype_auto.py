"""Every format quantkit writes loads in plain transformers + compressed-tensors with
``dtype="auto"``, from a float32 and from a bfloat16 source, and its logits stay near the float
model's.

compressed-tensors decompresses the FP4 and MX formats to bfloat16 whatever the model's dtype;
their checkpoints declare bfloat16 (``formats.compressed_tensors.checkpoint_dtype``), so a float32
source no longer yields a model whose float32 activations meet bfloat16 weights.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import quantkit
from quantkit.config.scheme import PRESETS
from quantkit.formats.compressed_tensors import READER_BF16_FORMATS

from model_factory import make_llama_dir, random_ids

# Relative logit error (Frobenius norm over 2 x 16 tokens) against the float model, measured on
# this model with torch 2.13 on the CPU for both sources (the larger of the two, float32 and
# bfloat16 within 0.01 of each other everywhere), times 1.25. The 2-bit grid is near noise on a
# random model: its bound only says the checkpoint loads and computes.
MEASURED = {"W4A16": 0.322, "W8A16": 0.024, "W8A8": 0.036, "FP8": 0.114, "FP8_DYNAMIC": 0.114,
            "FP8_BLOCK": 0.112, "NVFP4A16": 0.299, "NVFP4": 0.382, "MXFP4A16": 0.322, "MXFP4": 0.445,
            "MXFP8A16": 0.082, "MXFP8": 0.114, "W4AFP8": 0.330, "W4A8": 0.323, "W2A16": 1.152,
            "W3A16": 0.660, "W5A16": 0.158, "W6A16": 0.082, "W7A16": 0.041}
MARGIN = 1.25

# compressed-tensors 0.20.1 builds an asymmetric pack-quantized module on the meta device without
# packing its zero point ([out, groups] where the checkpoint, as its own compressor and vLLM
# write it, holds [out / 8, groups]); transformers then refuses the size mismatch. A reader's
# limit: the packed layout is the format's, so quantkit keeps it.
ASYM = pytest.mark.xfail(strict=True, raises=RuntimeError,
                         reason="compressed-tensors' meta-device path does not pack asymmetric zero points")
CASES = [pytest.param(p, marks=ASYM) if p == "W4A16_ASYM" else p for p in PRESETS]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A tiny Llama whose every width is a multiple of 128 (FP8_BLOCK's block, W4A16's group),
    saved in float32 and in bfloat16, with each one's float logits."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("auto_dtype")
    make_llama_dir(root / "float32", hidden=256, intermediate=512, heads=4, kv_heads=2, seed=5)
    AutoModelForCausalLM.from_pretrained(root / "float32", dtype=torch.bfloat16).save_pretrained(root / "bfloat16")
    ids = torch.tensor(random_ids(2, 16, seed=8))
    return root, ids, {d: _logits(AutoModelForCausalLM.from_pretrained(root / d, dtype="auto"), ids)
                       for d in ("float32", "bfloat16")}


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


@pytest.mark.parametrize("source", ["float32", "bfloat16"])
@pytest.mark.parametrize("preset", CASES)
def test_loads_with_dtype_auto_near_the_float_model(sources, tmp_path, source, preset):
    root, ids, float_logits = sources
    out = quantkit.quantize(root / source, {"scheme": preset}, calibration=random_ids(4, 32)).save(tmp_path / "q")
    fmt = json.loads((out / "config.json").read_text())["quantization_config"]["format"]
    model = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    # the FP4 / MX formats in bfloat16 (what their reader decompresses to), the rest in the source's
    expected = torch.bfloat16 if fmt in READER_BF16_FORMATS else getattr(torch, source)
    assert model.dtype == expected
    ref = float_logits[source]
    rel = float((_logits(model, ids) - ref).norm() / ref.norm())
    assert rel <= MEASURED[preset] * MARGIN, f"{preset} from {source}: relative logit error {rel:.4f}"
