"""gpt-oss: experts held transposed, gate and up interleaved, with biases and a clamped SwiGLU
(``quantkit/arch/families/gpt_oss.py``), stored fused on disk and read per expert
(``quantkit/pipeline/fused_experts.py``); its MXFP4 release layout re-quantized.

The output names every expert's linears apart (``mlp.experts.<e>.gate_proj.weight_packed``, ...),
as llm-compressor's linearized gpt-oss does. ``quantkit.load`` reads it back. Plain transformers
5.24 does not: it has no mapping from per-expert names to gpt-oss's fused parameters, so it
reports them missing and initialises them at random (checked below; docs/PLATFORM.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inputs"))

from families import family_config, save_random  # noqa: E402
from model_factory import random_ids, save_byte_tokenizer  # noqa: E402
from quantized_sources import save_mxfp4_source  # noqa: E402

import quantkit  # noqa: E402
from quantkit.arch.experts import unfuse_model  # noqa: E402
from quantkit.arch.lookup import arch_for  # noqa: E402
from quantkit.inputs.source import SafetensorsSource  # noqa: E402
from quantkit.pipeline.fused_experts import FusedExpertsSource, per_expert_view  # noqa: E402
from quantkit.runtime.dequantized import load_dequantized  # noqa: E402

_IDS = torch.tensor(random_ids(1, 64, vocab=256, seed=3))


def _config():
    config = family_config("gpt-oss")
    config.vocab_size = 260          # the byte tokenizer's ids and its <eos>
    config.architectures = ["GptOssForCausalLM"]
    return config


def _eager(model):
    """transformers' own per-expert loop (its grouped-mm kernels take no float64)."""
    model.set_experts_implementation("eager")
    return model


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory):
    torch.set_num_threads(1)
    folder = save_random(_config(), tmp_path_factory.mktemp("gpt-oss") / "model", seed=1)
    save_byte_tokenizer(folder)
    return folder


def _logits(model, ids=_IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def test_per_expert_modules_compute_what_transformers_fused_experts_compute():
    """The unfused block against transformers' ``GptOssExperts`` on random weights (large enough
    for the clamps at ``swiglu_limit`` to act), in float64: equal up to summation order."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = _eager(AutoModelForCausalLM.from_config(_config(), dtype=torch.float64))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    fused = model.model.layers[0].mlp.experts
    x = torch.randn(24, 128, dtype=torch.float64)
    index = torch.randint(0, 4, (24, 2))
    weights = torch.rand(24, 2, dtype=torch.float64)
    want, want_logits = fused(x, index, weights), _logits(model)
    gate_up, bias = fused.gate_up_proj.detach().clone(), fused.gate_up_proj_bias.detach().clone()
    assert unfuse_model(model, model.config) == 2
    experts = model.model.layers[0].mlp.experts
    assert torch.equal(experts[2].gate_proj.weight, gate_up[2][:, 0::2].T)   # gate: the even columns
    assert torch.equal(experts[2].up_proj.bias, bias[2][1::2])               # up: the odd ones
    got = experts(x, index, weights)
    assert (want.abs() > 7).any()                                           # the clamps are reached
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_logits(model), want_logits, rtol=1e-12, atol=1e-12)


def test_the_family_file_describes_the_experts_and_keeps_the_router():
    spec = arch_for(_config())[1]
    assert spec.moe is not None and spec.moe.router == "router"
    assert spec.moe.layout.transposed and spec.moe.layout.interleaved and spec.moe.layout.bias
    assert spec.attention == "self_attn"           # sinks are a parameter of it, written as read


def test_a_described_layout_the_module_does_not_have_is_refused_in_one_line():
    """The family file's description is checked against the module, not trusted."""
    from dataclasses import replace

    from quantkit.arch.derive import experts_spec
    from quantkit.arch.meta import traceable_model
    from quantkit.errors import QuantkitError

    layer = traceable_model(_config()).model.layers[0]
    moe = arch_for(_config())[1].moe
    assert experts_spec(layer, moe) == moe
    with pytest.raises(QuantkitError) as e:
        experts_spec(layer, replace(moe, layout=replace(moe.layout, transposed=False)))
    assert "not held as its family file describes them (ExpertLayout(transposed=False" in str(e.value)
    assert "\n" not in str(e.value)


def _rtn_int8_fused_reference(folder: Path):
    """The float model with every decoder linear and every expert rounded per output channel to
    int8 (absmax / 127.5) by a plain reference on transformers' own modules: each expert's
    output channel is a column of ``gate_up_proj [E, H, 2I]`` / ``down_proj [E, I, H]``."""
    from transformers import AutoModelForCausalLM

    model = _eager(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and name.startswith("model.layers."):
                s = m.weight.abs().amax(dim=1, keepdim=True) / 127.5
                m.weight.copy_(torch.clamp(torch.round(m.weight / s), -128, 127) * s)
            if isinstance(getattr(m, "gate_up_proj", None), torch.Tensor):
                for w in (m.gate_up_proj, m.down_proj):
                    s = w.abs().amax(dim=1, keepdim=True) / 127.5
                    w.copy_(torch.clamp(torch.round(w / s), -128, 127) * s)
    return model


def test_w8a16_reads_back_as_round_to_nearest(gpt_oss_dir, tmp_path):
    """Read back by ``quantkit.load``: the float model with its decoder linears and experts rounded
    by the plain reference (measured 4e-7 of the largest logit: float32 summation order). Routers
    stay in the model's dtype and in ``ignore``; biases and sinks are written as read."""
    torch.set_num_threads(1)
    out = quantkit.quantize(str(gpt_oss_dir), "w8a16").save(tmp_path / "out")
    stored = load_file(str(out / "model.safetensors"))
    assert "model.layers.1.mlp.experts.3.up_proj.weight_packed" in stored
    assert "model.layers.1.mlp.experts.3.up_proj.bias" in stored and "model.layers.0.self_attn.sinks" in stored
    assert not any(k.endswith(("gate_up_proj", "gate_up_proj_bias")) for k in stored)
    assert stored["model.layers.0.mlp.router.weight"].dtype == torch.float32
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert {"model.layers.0.mlp.router", "model.layers.1.mlp.router"} <= set(ignore)
    ref = _logits(_rtn_int8_fused_reference(gpt_oss_dir))
    got = _logits(quantkit.load(out))
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_an_in_memory_model_converts_as_its_folder_does(gpt_oss_dir, tmp_path):
    """The Python API's path splits the fused state dict by the same layout (``per_expert_state``)."""
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(gpt_oss_dir, dtype=torch.float32)
    a = load_file(str(quantkit.quantize(model, "w8a16").save(tmp_path / "memory") / "model.safetensors"))
    b = load_file(str(quantkit.quantize(str(gpt_oss_dir), "w8a16").save(tmp_path / "folder") / "model.safetensors"))
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []


def test_plain_transformers_does_not_map_per_expert_names_to_gpt_oss(gpt_oss_dir, tmp_path):
    """What docs/PLATFORM.md says: transformers 5.24 reports the fused experts missing."""
    from transformers import AutoModelForCausalLM

    out = quantkit.quantize(str(gpt_oss_dir), "w8a16").save(tmp_path / "out")
    _, info = AutoModelForCausalLM.from_pretrained(out, dtype="auto", output_loading_info=True)
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in info["missing_keys"])


def test_gptq_beats_round_to_nearest(gpt_oss_dir, tmp_path):
    """GPTQ W4A16 g64 over the unfused experts (their sub-groups after attention's) loses less than
    RTN on the calibration rows, both read back by ``quantkit.load``."""
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    ids = random_ids(8, 64, vocab=256, seed=5)
    ref = _eager(AutoModelForCausalLM.from_pretrained(gpt_oss_dir, dtype=torch.float32))
    errors = {}
    for recipe in ("w4a16-g64", "w4a16-g64-gptq"):
        out = quantkit.quantize(str(gpt_oss_dir), recipe, calibration=ids).save(tmp_path / recipe)
        got = quantkit.load(out)
        errors[recipe] = sum(float((_logits(ref, torch.tensor([r])) - _logits(got, torch.tensor([r]))).pow(2).mean())
                             for r in ids[:4])
    assert errors["w4a16-g64-gptq"] < errors["w4a16-g64"], errors


def test_the_source_view_reads_one_expert_at_a_time(gpt_oss_dir, tmp_path):
    """Each expert's slabs of the fused tensors are read once, alone, and only that expert is held;
    an MXFP4 source decodes one expert's blocks and scales the same way, to the same numbers."""
    source = SafetensorsSource(gpt_oss_dir)
    reads = []
    get_slab = source.get_slab
    source.get_slab = lambda name, index: reads.append((name, index)) or get_slab(name, index)
    view = per_expert_view(source, arch_for(_config())[1].moe)
    assert isinstance(view, FusedExpertsSource)
    assert "model.layers.0.mlp.experts.gate_up_proj" not in view and "model.layers.0.mlp.experts.3.down_proj.bias" in view
    for layer in (0, 1):
        for e in range(4):
            for leaf in ("gate_proj.weight", "up_proj.bias", "down_proj.weight"):
                name = f"model.layers.{layer}.mlp.experts.{e}.{leaf}"
                t = view.get(name)
                assert view.describe(name) == (torch.float32, tuple(t.shape)) and t.is_contiguous()
            assert view._held[0] == f"model.layers.{layer}.mlp.experts.{e}"
    assert len(reads) == 32 and len(set(reads)) == 32    # 4 fused tensors x 4 experts x 2 blocks, each slab once
    mxfp4 = SafetensorsSource(save_mxfp4_source(gpt_oss_dir, tmp_path / "mxfp4"))
    for name in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        assert torch.equal(mxfp4.get_slab(name, 2), mxfp4.get(name)[2])


def test_streamed_experts_read_from_fused_tensors_give_the_whole_layer_checkpoint(gpt_oss_dir, tmp_path):
    """Experts onloaded one at a time (``layer_memory`` 1 byte), each read from the fused tensors
    on its own: the checkpoint equals the whole-layer run's bit for bit (GPTQ W4A16 g64)."""
    torch.set_num_threads(1)
    ids = random_ids(4, 32, vocab=256, seed=6)
    recipe = {"scheme": "W4A16", "group_size": 64, "algorithm": "gptq"}
    lines: list[str] = []
    whole = quantkit.quantize(str(gpt_oss_dir), recipe, ids).save(tmp_path / "whole")
    streamed = quantkit.quantize(str(gpt_oss_dir), {**recipe, "calibration": {"layer_memory": 1}}, ids,
                                 quantkit.ConvertOptions(log=lines.append)).save(tmp_path / "streamed")
    assert sum("experts onloaded 1 at a time" in line for line in lines) == 2, lines
    a, b = load_file(str(whole / "model.safetensors")), load_file(str(streamed / "model.safetensors"))
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []


# -- a gpt-oss MXFP4 source ----------------------------------------------------------------------
def _float_copy(source_dir: Path, out: Path) -> Path:
    """The plain float model an MXFP4 source stands for: its experts dequantized, no quantization_config."""
    source = SafetensorsSource(source_dir)
    out.mkdir()
    save_file({k: source.get(k).contiguous() for k in source.keys()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config = json.loads((source_dir / "config.json").read_text())
    config.pop("quantization_config")
    (out / "config.json").write_text(json.dumps(config))
    for side in source_dir.glob("tokenizer*"):
        (out / side.name).write_bytes(side.read_bytes())
    return out


def _convert(model, out, recipe, *extra):
    return subprocess.run([sys.executable, "-m", "quantkit.cli", "convert", str(model), "--recipe", recipe, "--out",
                           str(out), "--no-eval", *extra], capture_output=True, text=True, timeout=600)


# Relative logit error (1 x 64 tokens) of each recipe's output, read by quantkit.load, against the
# model it was made from, measured on the plain float copy of the dequantized source (the same
# tensors, no quantization_config), torch 2.13 on the CPU: W8A16 0.0175, W4A16 g64 GPTQ 0.483 (a
# random tiny model carries 4-bit noise far). The MXFP4 source converts to the very same tensors,
# so it meets the float copy's error; the measurement, with a margin of 1.25, bounds both.
MEASURED = {"w8a16": 0.0175, "w4a16-g64-gptq": 0.483}


@pytest.mark.parametrize("recipe", list(MEASURED))
def test_an_mxfp4_source_requantizes_through_convert(gpt_oss_dir, tmp_path, recipe):
    torch.set_num_threads(1)
    source_dir = save_mxfp4_source(gpt_oss_dir, tmp_path / "mxfp4")
    float_dir = _float_copy(source_dir, tmp_path / "float")
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"Row {i}: the parcel left the depot at {i % 24}:00 on day {i}."})
                             + "\n" for i in range(40)))
    extra = ("--calib", str(calib), "--num-samples", "8", "--max-seq-len", "32") if "gptq" in recipe else ()
    outs = {}
    for name, model in (("mxfp4", source_dir), ("float", float_dir)):
        res = _convert(model, tmp_path / f"out-{name}", recipe, *extra)
        assert res.returncode == 0, res.stderr[-2000:]
        outs[name] = tmp_path / f"out-{name}"
    written = {n: load_file(str(o / "model.safetensors")) for n, o in outs.items()}
    assert written["mxfp4"].keys() == written["float"].keys()
    assert all(torch.equal(t, written["float"][k]) for k, t in written["mxfp4"].items())
    reference = _logits(_eager(load_dequantized(source_dir)))
    rel = {n: float((_logits(quantkit.load(o)) - reference).norm() / reference.norm()) for n, o in outs.items()}
    assert rel["mxfp4"] <= rel["float"] + 1e-6 and rel["float"] <= MEASURED[recipe] * 1.25, rel
