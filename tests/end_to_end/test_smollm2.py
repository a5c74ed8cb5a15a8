"""The spine on the real embedded model, SmolLM2-135M-Instruct: convert, pack, reload.

Its weights sit on a 4-bit asymmetric group-32 grid already (docs/PLATFORM.md), so the W4A16 check
uses the symmetric group-64 grid, where quantization error is real.
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import quantkit
from quantkit.errors import QuantkitError
from quantkit.formats.compressed_tensors import decompress_module
from quantkit.runtime.modules import QuantLinear

from heldout import heldout_ids, window_perplexity

pytestmark = pytest.mark.slow

PRESETS = {
    "W4A16": "w4a16-g64", "W4A16_ASYM": {"scheme": "W4A16_ASYM", "group_size": 64},
    "W8A16": "w8a16", "W8A8": "w8a8", "FP8": "fp8", "FP8_DYNAMIC": "fp8-dynamic",
}


@pytest.fixture(scope="module")
def converted(smollm2_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("smollm2")
    out = {}
    for name, recipe in PRESETS.items():
        if name == "FP8":
            recipe = quantkit.load_recipe(recipe).with_overrides(num_samples=16, max_seq_len=256)
        out[name] = quantkit.quantize(smollm2_dir, recipe).save(root / name)
    return out


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def fp32(smollm2_dir):
    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def test_every_preset_converts(converted):
    for name, path in converted.items():
        qc = json.loads((path / "config.json").read_text())["quantization_config"]
        assert qc["config_groups"]["group_0"]["weights"]["num_bits"] in (4, 8), name
        assert (path / "tokenizer.json").exists() and (path / "chat_template.jinja").exists()
        assert (path / "generation_config.json").exists()


def test_w4a16_group_128_is_refused_with_the_key(smollm2_dir):
    with pytest.raises(QuantkitError, match="group_size 128 does not divide in_features 576"):
        quantkit.quantize(smollm2_dir, "w4a16")


@pytest.mark.parametrize("name", ["W4A16", "W8A16"])
def test_transformers_compressed_tensors_match(converted, tokenizer, name):
    """transformers + compressed-tensors load our checkpoint: logits within 1e-3, weights identical."""
    import compressed_tensors  # noqa: F401
    ids = tokenizer("The capital of France is Paris. The number 1234 plus 1 is", return_tensors="pt").input_ids
    ours = quantkit.load(converted[name])
    theirs = AutoModelForCausalLM.from_pretrained(converted[name], dtype=torch.float32)
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
    assert float((a - b).norm() / b.norm()) < 1e-3
    # every decoder linear decodes to exactly the weight compressed-tensors decompressed
    n = 0
    for mod_name, m in ours.named_modules():
        if isinstance(m, QuantLinear):
            sd = {k: v for k, v in m.state_dict().items()}
            mine = decompress_module(sd, m.scheme)
            assert torch.equal(mine, theirs.get_submodule(mod_name).weight.data), mod_name
            n += 1
    assert n == 30 * 7


def test_heldout_perplexity(converted, fp32, tokenizer, capsys):
    ids = heldout_ids(tokenizer, 2048)
    base = window_perplexity(fp32, ids)
    ppl = {name: window_perplexity(quantkit.load(converted[name]), ids)
           for name in ("W8A16", "FP8_DYNAMIC", "W4A16", "W8A8")}
    with capsys.disabled():
        print("\nheld-out perplexity (2048 tokens, 512-token windows): fp32 %.3f, %s" %
              (base, ", ".join(f"{k} {v:.3f} ({100 * (v / base - 1):+.2f}%)" for k, v in ppl.items())))
    assert ppl["W8A16"] <= base * 1.01
    assert ppl["FP8_DYNAMIC"] <= base * 1.04
    assert ppl["W8A8"] <= base * 1.08
    assert base < ppl["W4A16"] < base * 2.0  # recorded: the RTN baseline GPTQ must beat
