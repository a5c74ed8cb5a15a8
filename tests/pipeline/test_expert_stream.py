"""A decoder layer over ``calibration.layer_memory``: its MoE experts onloaded a chunk at a time.

The streamed conversion must give the whole-layer conversion's checkpoint bit for bit where the
block has no shared expert (the same positions through each expert, the sums added in the same
order), hold at most one chunk of experts at a time, and report the same expert coverage.
"""

import json

import pytest
import torch
from safetensors import safe_open

import quantkit
from quantkit.errors import QuantkitError
from quantkit.pipeline import batches as pipeline_batches
from quantkit.pipeline import runner, stream
from quantkit.pipeline.expert_stream import module_bytes, plan_stream
from quantkit.recipe import Recipe

from model_factory import random_ids
from moe_models import make_moe_dir

CALIB = random_ids(4, 32)
RECIPES = {
    "w4a16-rtn": {"scheme": "W4A16", "group_size": 32},
    "w4a16-gptq": {"scheme": "W4A16", "group_size": 32, "algorithm": "gptq"},
    # static activation scales: observed on each expert's inputs in the chunk's propagating pass
    "fp8-static-routed": {"scheme": "FP8", "calibration": {"moe_experts": "routed"}},
}


def _tensors(folder):
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(f, "pt") as g:
            out.update({k: g.get_tensor(k) for k in g.keys()})
    return out


def _log(folder):
    return json.loads((folder / "quantization_log.json").read_text())


def _with(recipe: dict, **calibration) -> dict:
    r = json.loads(json.dumps(recipe))
    r.setdefault("calibration", {}).update(calibration)
    return r


def _convert(src, recipe, out, lines=None, **kw):
    options = quantkit.ConvertOptions(log=lines.append if lines is not None else None, **kw)
    return quantkit.quantize(src, recipe, CALIB, options).save(out)


@pytest.mark.parametrize("arch", ["Qwen3MoeForCausalLM", "MixtralForCausalLM"])
@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize("offload", [False, True])
def test_streamed_experts_give_the_whole_layer_checkpoint_bit_for_bit(arch, recipe, offload, tmp_path, monkeypatch):
    """One expert at a time (layer_memory 1 byte), four calibration batches (the whole layer runs
    them in lockstep, the chunks one after another): every tensor, every module's statistics
    and the coverage table equal the whole-layer run's."""
    monkeypatch.setattr(pipeline_batches, "MICRO_BATCH_TOKENS", 32)   # one sample per batch
    src = make_moe_dir(tmp_path / "src", arch)
    rec = _with(RECIPES[recipe], offload=offload)
    whole = _convert(src, rec, tmp_path / "whole", workdir=tmp_path / "w1")
    lines: list[str] = []
    streamed = _convert(src, _with(rec, layer_memory=1), tmp_path / "streamed", lines, workdir=tmp_path / "w2")
    assert sum("experts onloaded 1 at a time" in line for line in lines) == 2, lines
    a, b = _tensors(whole), _tensors(streamed)
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    la, lb = _log(whole), _log(streamed)
    assert la["modules"] == lb["modules"]
    assert la.get("moe_coverage") == lb.get("moe_coverage")
    assert ("moe_coverage" in la) == (recipe != "w4a16-rtn")   # RTN takes no calibration data
    assert json.loads((whole / "config.json").read_text()) == json.loads((streamed / "config.json").read_text())


def test_a_shared_expert_is_added_in_the_other_order_only(tmp_path):
    """Qwen2-MoE: the shared expert's output joins the residual before the routed experts' sum
    instead of with it, so the streamed checkpoint differs by rounding only: layer 0's attention
    and shared expert are the same bytes, and from there on a rounding-level change in the hidden
    states can flip a few GPTQ codes. The streamed model's logits differ from the whole-layer
    model's by under a tenth of what quantization itself moved them."""
    from transformers import AutoModelForCausalLM

    src = make_moe_dir(tmp_path / "src", "Qwen2MoeForCausalLM")
    rec = RECIPES["w4a16-gptq"]
    whole = _convert(src, rec, tmp_path / "whole")
    streamed = _convert(src, _with(rec, layer_memory=1), tmp_path / "streamed")
    a, b = _tensors(whole), _tensors(streamed)
    assert a.keys() == b.keys()
    first = [k for k in a if k.startswith("model.layers.0.") and ".experts." not in k]
    assert first and all(torch.equal(a[k], b[k]) for k in first)
    ids = torch.tensor(CALIB[:2])
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(src)(ids).logits
        la, lb = quantkit.load(whole)(ids).logits, quantkit.load(streamed)(ids).logits
    quantization = float((la - base).norm() / base.norm())
    order = float((lb - la).norm() / la.norm())
    print(f"\nstreamed vs whole {order:.2e}, quantization {quantization:.2e}")
    assert order < 0.1 * quantization, (order, quantization)


def test_at_most_one_chunk_of_experts_is_materialised(tmp_path, monkeypatch):
    """A budget of the layer's other weights plus two experts: chunks of two, and no moment with
    more than two experts' weights off the meta device."""
    from transformers import AutoConfig

    from quantkit.pipeline.onload import build_skeleton

    src = make_moe_dir(tmp_path / "src", "Qwen3MoeForCausalLM")
    layer = build_skeleton(AutoConfig.from_pretrained(src)).model.layers[0]
    experts = layer.mlp.experts
    budget = module_bytes(layer) - module_bytes(experts) + 2 * module_bytes(experts[0])
    assert plan_stream(layer, budget).chunks == [[0, 1], [2, 3]]
    assert plan_stream(layer, module_bytes(layer)) is None
    live: dict[int, str] = {}     # materialised modules -> their prefix
    held: list[int] = []          # experts live after each expert's onload
    real_materialize, real_dematerialize = runner.materialize, runner.dematerialize

    def materialize(module, prefix, source, device="cpu", skip=None):
        real_materialize(module, prefix, source, device, skip)
        live[id(module)] = prefix
        if ".experts." in prefix:
            held.append(sum(".experts." in p for p in live.values()))

    def dematerialize(module):
        real_dematerialize(module)
        prefix = live.pop(id(module), None)
        for k, p in list(live.items()):
            if prefix is not None and p.startswith(prefix):
                del live[k]

    for module in (runner, stream):   # the layer's onload and drop, and each chunk of experts'
        monkeypatch.setattr(module, "materialize", materialize)
        monkeypatch.setattr(module, "dematerialize", dematerialize)
    _convert(src, _with(RECIPES["w4a16-gptq"], layer_memory=budget), tmp_path / "q")
    assert held == [1, 2] * 4   # two layers, two chunks each


def test_transforms_on_a_streamed_layer_are_refused_naming_the_key(tmp_path):
    src = make_moe_dir(tmp_path / "src", "Qwen3MoeForCausalLM")
    rec = {"scheme": "W4A16", "group_size": 32, "steps": ["awq", "gptq"], "calibration": {"layer_memory": 1}}
    work = tmp_path / "work"
    with pytest.raises(QuantkitError, match=r"model\.layers\.0: .*calibration\.layer_memory"):
        quantkit.quantize(src, rec, CALIB, quantkit.ConvertOptions(workdir=work))
    assert list(work.iterdir()) == []   # the staging folder (non-layer tensors already written) is gone


@pytest.mark.parametrize("value,expected", [("4GB", 4 * 10**9), ("512MiB", 512 * 2**20), (4096, 4096)])
def test_layer_memory_reads_sizes(value, expected):
    r = Recipe.from_dict({"scheme": "W4A16", "calibration": {"layer_memory": value}})
    assert r.calibration.layer_memory == expected


@pytest.mark.parametrize("value", ["lots", 0, -1])
def test_layer_memory_refuses_what_is_not_a_size(value):
    with pytest.raises(QuantkitError, match="calibration.layer_memory"):
        Recipe.from_dict({"scheme": "W4A16", "calibration": {"layer_memory": value}})
