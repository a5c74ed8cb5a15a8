"""Sources that arrive quantized: FP8 with block scales and gpt-oss's MXFP4 experts read as the
float tensors they stand for, under the model's own names, their scales hidden."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, Mxfp4Config
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from quantkit.errors import QuantkitError
from quantkit.inputs.source import SafetensorsSource
from quantkit.pipeline.layout import check_layout
from quantkit.runtime.dequantized import load_dequantized

from families import family_config, save_random
from model_factory import make_llama_dir, random_ids, save_byte_tokenizer
from quantized_sources import (fp8_block_reference, make_gpt_oss_dir, save_dequantized, save_fp8_block_source,
                               save_mxfp4_source)

EXPERTS = ("gate_up_proj", "down_proj")


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    """A Llama (hidden 320, intermediate 448: partial 128-blocks at the edges, k/v 64 rows) as an
    FP8 block source, and the plain float model it stands for."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fp8src")
    float_dir = make_llama_dir(root / "float", hidden=320, intermediate=448, heads=5, kv_heads=1, vocab=260, seed=3)
    save_byte_tokenizer(float_dir)
    source = save_fp8_block_source(float_dir, root / "fp8")
    return source, save_dequantized(source, root / "dequantized")


@pytest.fixture(scope="module")
def mxfp4(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("mxfp4src")
    return save_mxfp4_source(make_gpt_oss_dir(root / "float"), root / "mxfp4")


# -- FP8 with block scales ----------------------------------------------------------------------
def test_fp8_block_weights_equal_the_reference_dequantization(fp8):
    source_dir, _ = fp8
    stored = load_file(str(source_dir / "model.safetensors"))
    source = SafetensorsSource(source_dir)
    scales = [k for k in stored if k.endswith("_scale_inv")]
    assert len(scales) == 14
    for k in scales:
        name = k.removesuffix("_scale_inv")
        assert k not in source and k not in set(source.keys()) and name in source
        assert source.describe(name) == (torch.float32, tuple(stored[name].shape))
        assert torch.equal(source.get(name), fp8_block_reference(stored[name], stored[k]))
    assert source.describe("model.norm.weight") == (torch.float32, (320,))


def _rewrite(src, dst, config=None, tensors=None):
    dst.mkdir()
    stored = load_file(str(src / "model.safetensors"))
    save_file({**stored, **(tensors or {})}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"].update(config or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("case, config, tensors, needle", [
    ("scale_shape", None, {"model.layers.0.mlp.up_proj.weight_scale_inv": torch.ones(3, 3)},
     "model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight_scale_inv' is F32 [3, 3], but "
     "'model.layers.0.mlp.up_proj.weight' [448, 320] in 128x128 blocks (quantization_config.weight_block_size) "
     "needs float [4, 3]"),
    ("block_size", {"weight_block_size": 128}, None, "config.json: quantization_config.weight_block_size is 128"),
    ("block_size_mismatch", {"weight_block_size": [64, 64]}, None, "in 64x64 blocks"),
    ("fmt", {"fmt": "e5m2"}, None, "config.json: quantization_config.fmt is 'e5m2'"),
])
def test_fp8_block_layout_faults_are_one_line(fp8, tmp_path, case, config, tensors, needle):
    bad = _rewrite(fp8[0], tmp_path / case, config, tensors)
    with pytest.raises(QuantkitError) as e:
        SafetensorsSource(bad)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_fp8_block_fault_exits_2_through_convert(fp8, tmp_path):
    bad = _rewrite(fp8[0], tmp_path / "bad", {"weight_block_size": [64, 128]})
    res = _convert(bad, tmp_path / "out", "w8a16")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {bad / 'model.safetensors'}: tensor 'model.layers.0.mlp.down_proj.weight_scale_inv' is F32 [3, 4], "
        "but 'model.layers.0.mlp.down_proj.weight' [320, 448] in 64x128 blocks "
        "(quantization_config.weight_block_size) needs float [5, 4]"]


def _convert(model, out, recipe, *extra):
    return subprocess.run([sys.executable, "-m", "quantkit.cli", "convert", str(model), "--recipe", recipe, "--out",
                           str(out), "--no-eval", *extra], capture_output=True, text=True, timeout=600)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def _rel(a, b):
    return float((a - b).norm() / b.norm())


# Relative logit error (2 x 16 tokens) of each recipe's checkpoint, loaded by transformers with
# dtype="auto", against the model it was made from, measured on the plain float copy of the
# dequantized source (the same tensors, no quantization_config), torch 2.13 on the CPU:
# W8A16 0.0233, W4A16 g64 GPTQ 0.378 (a random tiny model carries 4-bit noise far). The FP8
# source converts to the same tensors, so it must meet the float source's error itself; the
# measurement, with a margin of 1.25, bounds both.
MEASURED = {"w8a16": 0.0233, "w4a16-g64-gptq": 0.378}


@pytest.mark.parametrize("recipe", list(MEASURED))
def test_fp8_block_source_requantizes_through_convert(fp8, tmp_path, recipe):
    source_dir, float_dir = fp8
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"Row {i}: the parcel left the depot at {i % 24}:00 on day {i}."})
                             + "\n" for i in range(40)))
    extra = ("--calib", str(calib), "--num-samples", "8", "--max-seq-len", "32") if "gptq" in recipe else ()
    outs = {}
    for name, model in (("fp8", source_dir), ("float", float_dir)):
        res = _convert(model, tmp_path / name, recipe, *extra)
        assert res.returncode == 0, res.stderr[-2000:]
        outs[name] = tmp_path / name
    written = {n: load_file(str(o / "model.safetensors")) for n, o in outs.items()}
    assert written["fp8"].keys() == written["float"].keys()
    assert all(torch.equal(t, written["float"][k]) for k, t in written["fp8"].items())
    qc = json.loads((outs["fp8"] / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and "weight_block_size" not in qc and "fmt" not in qc
    ids = torch.tensor(random_ids(2, 16, vocab=256, seed=8))
    reference = _logits(load_dequantized(source_dir), ids)
    assert torch.equal(reference, _logits(AutoModelForCausalLM.from_pretrained(float_dir), ids))
    rel = {n: _rel(_logits(AutoModelForCausalLM.from_pretrained(o, dtype="auto"), ids), reference)
           for n, o in outs.items()}
    assert rel["fp8"] <= rel["float"] + 1e-6 and rel["float"] <= MEASURED[recipe] * 1.25, rel


# GPTQ with every MoE expert onloaded on its own (layer_memory: 1 byte, the streamed path)
STREAMED_GPTQ = """version: 1
config_groups:
  group_0:
    targets: [Linear]
    weights: {num_bits: 4, type: int, symmetric: true, strategy: group, group_size: 64, actorder: weight}
ignore: [lm_head]
algorithm: {name: gptq, block_size: 64}
calibration: {layer_memory: 1}
"""


def test_a_deepseek_v3_fp8_source_converts_as_its_float_copy(tmp_path):
    """DeepSeek-V3's own layout (per-expert FP8 linears, the MLA projections with edge blocks, the
    router and its bias in float) through GPTQ with streamed experts: the same bytes as the plain
    float copy of the dequantized source."""
    torch.set_num_threads(1)
    config = family_config("DeepSeek-V3")
    config.vocab_size = 260   # the byte tokenizer's ids
    float_dir = save_byte_tokenizer(save_random(config, tmp_path / "float"))
    source = save_fp8_block_source(float_dir, tmp_path / "fp8")
    assert sum(k.endswith("_scale_inv") for k in load_file(str(source / "model.safetensors"))) == 28
    recipe, calib = tmp_path / "streamed.yaml", tmp_path / "calib.jsonl"
    recipe.write_text(STREAMED_GPTQ)
    calib.write_text("".join(json.dumps({"text": f"Row {i}: the parcel left the depot at {i % 24}:00."}) + "\n"
                             for i in range(40)))
    written = []
    for name, model in (("fp8", source), ("float", save_dequantized(source, tmp_path / "dequantized"))):
        res = _convert(model, tmp_path / f"out-{name}", str(recipe), "--calib", str(calib), "--num-samples", "8",
                       "--max-seq-len", "32")
        assert res.returncode == 0, res.stderr[-2000:]
        written.append(load_file(str(tmp_path / f"out-{name}" / "model.safetensors")))
    assert written[0].keys() == written[1].keys()
    assert all(torch.equal(t, written[1][k]) for k, t in written[0].items())


def test_linears_the_recipe_keeps_are_said_in_one_line(fp8, tmp_path):
    res = _convert(fp8[0], tmp_path / "out", "w8a16", "--ignore", "re:.*down_proj")
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if "left unquantized" in ln]
    assert lines == [f"warning: {fp8[0] / 'config.json'}: 2 linears the source stores as FP8 with block scales "
                     "are left unquantized by the recipe (e.g. 'model.layers.0.mlp.down_proj'): written dequantized "
                     "in float32, since quantkit cannot keep the source's format"]


# -- gpt-oss MXFP4 experts ----------------------------------------------------------------------
def test_mxfp4_experts_equal_transformers_dequantization(mxfp4):
    stored = load_file(str(mxfp4 / "model.safetensors"))
    source = SafetensorsSource(mxfp4)
    theirs = AutoModelForCausalLM.from_pretrained(mxfp4, dtype=torch.float32,
                                                  quantization_config=Mxfp4Config(dequantize=True))
    for layer in range(2):
        for proj in EXPERTS:
            name = f"model.layers.{layer}.mlp.experts.{proj}"
            assert name + "_blocks" not in source and name + "_scales" not in source and name in source
            ours = source.get(name)
            assert source.describe(name) == (torch.float32, tuple(ours.shape))
            assert torch.equal(ours, convert_moe_packed_tensors(stored[name + "_blocks"], stored[name + "_scales"],
                                                                dtype=torch.float32))
            assert torch.equal(ours, theirs.get_parameter(name))
    # transformers' GptOssExperts layout: gate_up_proj [E, hidden, 2 * inter], down_proj [E, inter, hidden]
    assert source.describe("model.layers.0.mlp.experts.gate_up_proj")[1] == (4, 96, 128)
    assert source.describe("model.layers.0.mlp.experts.down_proj")[1] == (4, 64, 96)


def test_mxfp4_source_passes_the_layout_check_against_gpt_oss(mxfp4):
    """Every tensor presented has its place, shape and a float dtype in transformers' own gpt-oss
    (nothing dropped, no scale left over)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(mxfp4)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    warnings = []
    check_layout(model, "model.layers", config, SafetensorsSource(mxfp4), "config.json", warnings.append)
    assert warnings == []


def test_mxfp4_source_model_equals_transformers(mxfp4):
    ids = torch.tensor(random_ids(2, 16, vocab=256, seed=8))
    theirs = AutoModelForCausalLM.from_pretrained(mxfp4, dtype=torch.float32,
                                                  quantization_config=Mxfp4Config(dequantize=True))
    assert torch.equal(_logits(load_dequantized(mxfp4), ids), _logits(theirs, ids))


def test_mxfp4_scales_that_do_not_match_are_refused(mxfp4, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    stored = load_file(str(mxfp4 / "model.safetensors"))
    stored["model.layers.1.mlp.experts.down_proj_scales"] = stored["model.layers.1.mlp.experts.down_proj_scales"][:, :, :1]
    save_file({k: v.contiguous() for k, v in stored.items()}, str(bad / "model.safetensors"))
    (bad / "config.json").write_text((mxfp4 / "config.json").read_text())
    with pytest.raises(QuantkitError) as e:
        SafetensorsSource(bad)
    assert str(e.value) == (f"{bad / 'model.safetensors'}: tensor 'model.layers.1.mlp.experts.down_proj_scales' is "
                            "U8 [4, 96, 1], but 'model.layers.1.mlp.experts.down_proj_blocks' [4, 96, 2, 16] needs "
                            "U8 [4, 96, 2] (one E8M0 exponent per 32 values)")


def test_an_evaluation_baseline_is_the_dequantized_model(fp8):
    from quantkit.evaluation.checkpoint import load_model

    ids = torch.tensor(random_ids(2, 16, vocab=256, seed=8))
    assert torch.equal(_logits(load_model(fp8[0]), ids), _logits(AutoModelForCausalLM.from_pretrained(fp8[1]), ids))


def test_an_fp8_source_is_the_baseline_of_quantkit_eval(fp8, tmp_path):
    assert _convert(fp8[0], tmp_path / "out", "w8a16").returncode == 0
    res = subprocess.run([sys.executable, "-m", "quantkit.cli", "eval", "--baseline", str(fp8[0]), "--candidate",
                          str(tmp_path / "out"), "--suite", "numbers-en", "--out", str(tmp_path / "report")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "14 quantized modules checked against the baseline" in res.stderr + res.stdout
