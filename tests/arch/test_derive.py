"""The architecture derived from the model: equal to the table where the table names the family,
and enough to convert families quantkit names nowhere (tiny random models from transformers'
own config classes), read back by plain transformers + compressed-tensors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from arch_configs import tiny_config  # noqa: E402
from families import family_config, make_family_dir  # noqa: E402

import quantkit  # noqa: E402
from quantkit.arch.derive import derive_spec, fold_offset  # noqa: E402
from quantkit.arch.lookup import arch_for  # noqa: E402
from quantkit.arch.meta import auto_class, traceable_model  # noqa: E402
from quantkit.arch.table import ARCHITECTURES  # noqa: E402
from quantkit.errors import QuantkitError  # noqa: E402

# what a traced forward cannot show, and only the table says: a value head's fold into o_proj
# (attention mixes tokens between v_proj and o_proj) and a fused producer's rows (Phi3)
_UNTRACEABLE = ("kv_heads", "rows")


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_each_table_entry_equals_its_own_derivation_where_a_trace_can_tell(arch):
    config = tiny_config(arch)
    named = ARCHITECTURES[arch]
    derived = derive_spec(traceable_model(config), config)
    assert derived.layers == named.layers
    assert derived.subgroups == named.subgroups
    # the trace also pairs Qwen2-MoE's shared-expert gate/up (one input; vLLM fuses them too)
    assert set(named.fused) <= set(derived.fused)
    assert derived.norm_weight_offset == named.norm_weight_offset
    assert (derived.moe is None) == (named.moe is None)
    table = {(m.smooth, m.balance, m.parent) for m in named.smooth_mappings}
    found = {(m.smooth, m.balance, m.parent) for m in derived.smooth_mappings}
    # beyond the table: Qwen2-MoE's shared expert up -> down (a dense MLP beside the experts)
    extra = {m for m in found - table if m[0].startswith("mlp.shared_expert.")}
    assert found - extra <= table, f"derived mappings the table does not list: {found - table}"
    missing = [m for m in named.smooth_mappings if (m.smooth, m.balance, m.parent) not in found]
    # MoE: the table lists no post-attention mapping (the router reads it), and none is derived
    assert all(any(getattr(m, k) is not None for k in _UNTRACEABLE) or m.balance[0].startswith("mlp.")
               for m in missing), missing


def test_a_gemma_norm_folds_with_offset_one_and_a_llama_norm_with_zero():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    assert fold_offset(Gemma3RMSNorm(16)) == 1.0
    assert fold_offset(LlamaRMSNorm(16)) == 0.0
    assert fold_offset(torch.nn.LayerNorm(16)) == 0.0          # weight and bias both divide
    assert fold_offset(torch.nn.Linear(16, 16)) is None        # not a channel-wise norm


# families no file of quantkit names; and families the brief names whose structure derives
UNNAMED = ["OLMo 2", "Command R (Cohere)", "StarCoder2", "EXAONE 4", "GLM-4", "Helium"]
NAMED = ["DeepSeek-V3", "GLM-4.5", "Qwen3-Next", "Qwen3-VL", "Qwen2.5-VL", "Gemma 3 (multimodal)"]


def _nowhere_in_quantkit(config) -> bool:
    root = Path(quantkit.__file__).parent
    words = {config.model_type, type(config).__name__.removesuffix("Config")}
    return not any(w.lower() in p.read_text(encoding="utf-8").lower() for p in root.rglob("*.py") for w in words)


def test_the_unnamed_families_are_named_nowhere_in_quantkit():
    for family in UNNAMED:
        assert _nowhere_in_quantkit(family_config(family)), family


def _rtn_int8_reference(model: torch.nn.Module, layers: str, keep: tuple[str, ...]) -> None:
    """Per-channel symmetric int8 round-to-nearest of every linear in the decoder layers, in place
    (the absmax on the full code range's half-width, 127.5, as compressed-tensors' observers do)."""
    with torch.no_grad():
        for name, m in model.named_modules():
            if isinstance(m, torch.nn.Linear) and name.startswith(layers + ".") and not name.endswith(keep):
                scale = m.weight.abs().amax(dim=1, keepdim=True) / 127.5
                m.weight.copy_(torch.clamp(torch.round(m.weight / scale), -128, 127) * scale)


_IDS = [[int(x) for x in torch.randint(1, 256, (64,), generator=torch.Generator().manual_seed(i))] for i in range(8)]


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    made = {}

    def make(family):
        if family not in made:
            made[family] = make_family_dir(family, tmp_path_factory.mktemp("family") / "model")
        return made[family]
    return make


@pytest.mark.parametrize("family", UNNAMED + NAMED)
def test_w8a16_of_a_derived_family_reads_back_as_round_to_nearest(family, family_dirs, tmp_path):
    """The checkpoint, read by transformers + compressed-tensors, computes what the float model
    computes with its decoder linears rounded to int8 by a plain reference: targets, names and
    scales all right, nothing else touched (the experts included: they are linears of the layers
    in the checkpoint)."""
    torch.set_num_threads(1)
    folder = family_dirs(family)
    out = quantkit.quantize(str(folder), "w8a16").save(tmp_path / "out")
    config = family_config(family)
    cls = auto_class(config)
    got = cls.from_pretrained(out, dtype="auto")
    assert type(got).__name__ == type(cls.from_config(config)).__name__   # the model's own class
    ref = cls.from_pretrained(folder, dtype=torch.float32)
    spec = arch_for(ref.config)[1]
    layers = spec.layers
    _rtn_int8_reference(ref, layers, tuple("." + k for k in spec.keep))   # routers and scalar gates kept
    ref = _per_expert_rtn(ref, layers)
    a, b = _logits(ref, _IDS[0]), _logits(got, _IDS[0])
    # float32 sums in another order: measured 1e-6 of the largest logit on these models
    assert (a - b).abs().max() <= 1e-4 * a.abs().max(), family


def _per_expert_rtn(model, layers: str):
    """Round the fused experts' every expert row-wise to int8 as the checkpoint's per-expert linears are."""
    with torch.no_grad():
        for name, m in model.named_modules():
            gate_up, down = getattr(m, "gate_up_proj", None), getattr(m, "down_proj", None)
            if name.startswith(layers + ".") and isinstance(gate_up, torch.Tensor) and gate_up.ndim == 3:
                inter = down.shape[2]
                for w in (gate_up[:, :inter], gate_up[:, inter:], down):
                    scale = w.abs().amax(dim=2, keepdim=True) / 127.5
                    w.copy_(torch.clamp(torch.round(w / scale), -128, 127) * scale)
    return model


@pytest.mark.parametrize("family", ["OLMo 2", "StarCoder2", "DeepSeek-V3"])
def test_gptq_on_a_derived_family_beats_round_to_nearest_on_its_calibration_rows(family, family_dirs, tmp_path):
    """GPTQ's sub-groups come from the trace: were they wrong (a linear solved against inputs
    its earlier sub-groups had not yet changed, or left out), it would lose to plain RTN."""
    torch.set_num_threads(1)
    folder = family_dirs(family)
    cls = auto_class(family_config(family))
    ref = cls.from_pretrained(folder, dtype=torch.float32)
    errors = {}
    for recipe in ("w4a16-g64", "w4a16-g64-gptq"):
        out = quantkit.quantize(str(folder), recipe, calibration=_IDS).save(tmp_path / recipe)
        got = cls.from_pretrained(out, dtype="auto")
        errors[recipe] = sum(float((_logits(ref, ids) - _logits(got, ids)).pow(2).mean()) for ids in _IDS[:4])
    assert errors["w4a16-g64-gptq"] < errors["w4a16-g64"], errors


def test_fp8_dynamic_of_a_derived_family_converts_and_loads(family_dirs, tmp_path):
    torch.set_num_threads(1)
    folder = family_dirs("EXAONE 4")
    out = quantkit.quantize(str(folder), "fp8-dynamic").save(tmp_path / "out")
    import json
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "float-quantized" and "lm_head" in qc["ignore"]
    cls = auto_class(family_config("EXAONE 4"))
    a = _logits(cls.from_pretrained(folder, dtype=torch.float32), _IDS[0])
    b = _logits(cls.from_pretrained(out, dtype="auto"), _IDS[0])
    # FP8 E4M3 weights: 3 mantissa bits; measured 0.12 of the largest logit on EXAONE 4 and
    # 0.08-0.13 on OLMo 2, Granite, Cohere, StarCoder2 (benchmarks/families.py)
    assert (a - b).abs().max() <= 0.3 * a.abs().max()


def test_routers_and_scalar_gates_stay_in_the_models_dtype(family_dirs, tmp_path):
    """Qwen3-Next's shared-expert gate has one output and its router picks experts: both kept,
    listed in ``ignore``; DeepSeek-V3's router bias (a stored buffer) is written back."""
    spec = arch_for(family_config("Qwen3-Next"))[1]
    assert "mlp.shared_expert_gate" in spec.keep
    assert spec.moe is not None and spec.moe.router == "gate"
    import json

    from safetensors import safe_open
    out = quantkit.quantize(str(family_dirs("DeepSeek-V3")), "w8a16").save(tmp_path / "ds")
    keys = set()
    for f in out.glob("*.safetensors"):
        with safe_open(f, "pt") as h:
            keys |= set(h.keys())
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in keys
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert "model.layers.1.mlp.gate" in ignore


def test_experts_held_otherwise_and_described_nowhere_are_refused_in_one_line(monkeypatch):
    """Llama 4's experts (transposed, called with routed copies) without its family file."""
    from quantkit.arch import lookup
    from quantkit.arch.families import registry

    monkeypatch.setattr(lookup, "_DERIVED", {})
    monkeypatch.setattr(registry, "FAMILY_FIELDS", {k: v for k, v in registry.FAMILY_FIELDS.items()
                                                    if not k.startswith("Llama4")})
    config = family_config("Llama 4 (text)")
    config.architectures = ["Llama4ForCausalLM"]
    with pytest.raises(QuantkitError) as e:
        arch_for(config)
    assert "not held as transformers' convention" in str(e.value) and "\n" not in str(e.value)
    assert "quantkit/arch/" in str(e.value)


@pytest.mark.parametrize("family, recipe, words", [
    ("OLMo 2", "w4a16-g64-gptq-rot", "rotate.residual"),
    ("DeepSeek-V3", "fp8-dynamic-kv-fp8", "multi-head latent attention"),   # its family file says why
])
def test_what_a_trace_cannot_show_is_refused_in_one_line(family, recipe, words, family_dirs):
    with pytest.raises(QuantkitError) as e:
        quantkit.quantize(str(family_dirs(family)), recipe, calibration=_IDS)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_scale_folding_step_without_any_mapping_is_refused_and_a_partial_one_warns():
    from dataclasses import replace

    from quantkit.pipeline.fold_coverage import check_fold_coverage
    from quantkit.recipe import load_recipe

    recipe = load_recipe("awq-w4a16-g64")
    spec = arch_for(family_config("OLMo 2"))[1]
    warned: list[str] = []
    check_fold_coverage("Olmo2ForCausalLM", spec, recipe, warned.append)
    assert len(warned) == 1 and "self_attn.q_proj+self_attn.k_proj+self_attn.v_proj" in warned[0]
    with pytest.raises(QuantkitError, match="no place to fold scales"):
        check_fold_coverage("Olmo2ForCausalLM", replace(spec, smooth_mappings=()), recipe, warned.append)


def _stored(folder: Path) -> set[str]:
    from safetensors import safe_open

    keys: set[str] = set()
    for f in folder.glob("*.safetensors"):
        with safe_open(f, "pt") as h:
            keys |= set(h.keys())
    return keys


def test_a_checkpoint_stored_under_other_names_keeps_them(family_dirs, tmp_path):
    """Qwen2.5-VL's checkpoints store ``model.layers`` where its modules are
    ``model.language_model.layers``: quantkit reads by module name and writes the stored names
    back, the vision tower unquantized and in ``ignore``; quantkit.load reads the result too."""
    import json

    folder = family_dirs("Qwen2.5-VL")
    source = _stored(folder)
    assert any(k.startswith("model.layers.") for k in source)
    out = quantkit.quantize(str(folder), "w8a16").save(tmp_path / "out")
    written = _stored(out)
    assert not any(k.startswith("model.language_model.") for k in written)
    kept = {k for k in source if not k.endswith("_proj.weight") or k.startswith("visual.")}
    assert kept <= written and "model.layers.0.self_attn.q_proj.weight_packed" in written
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert any(n.startswith("model.visual.") for n in ignore) and "lm_head" in ignore
    a = _logits(quantkit.load(out), _IDS[1])
    b = _logits(auto_class(family_config("Qwen2.5-VL")).from_pretrained(out, dtype="auto"), _IDS[1])
    assert (a - b).abs().max() <= 1e-4 * b.abs().max()


def test_nvfp4_experts_say_plain_transformers_misreads_them(family_dirs, tmp_path):
    """transformers 5.25 fuses per-expert NVFP4 weights without their global scale
    (docs/PLATFORM.md): the conversion says so in its log, for a derived MoE family too."""
    import json

    out = quantkit.quantize(str(family_dirs("GLM-4.5")), "nvfp4a16").save(tmp_path / "out")
    warnings = json.loads((out / "quantization_log.json").read_text())["warnings"]
    assert any("weight_global_scale" in w and "quantkit.load" in w for w in warnings), warnings
    dense = quantkit.quantize(str(family_dirs("OLMo 2")), "nvfp4a16").save(tmp_path / "dense")
    assert not any("weight_global_scale" in w for w in json.loads((dense / "quantization_log.json").read_text())["warnings"])


def test_an_image_and_text_prompt_reads_back_as_the_reference(family_dirs, tmp_path):
    """The vision tower and projector stay as they were: an image+text prompt through the W8A16
    checkpoint equals the float model with only its decoder linears rounded, and the image moves
    the logits (the image path is really taken)."""
    torch.set_num_threads(1)
    folder = family_dirs("Qwen2.5-VL")
    out = quantkit.quantize(str(folder), "w8a16").save(tmp_path / "out")
    cls = auto_class(family_config("Qwen2.5-VL"))
    ref = cls.from_pretrained(folder, dtype=torch.float32)
    spec = arch_for(ref.config)[1]
    _rtn_int8_reference(ref, spec.layers, ())
    got = cls.from_pretrained(out, dtype="auto")
    # a 28 px image: 2x2 patches of 14 px, merged 2x2 into the one image token (250)
    pixels = torch.randn(4, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(0))
    inputs = dict(input_ids=torch.tensor([[5, 6, 252, 250, 253, 7, 8, 9]]), pixel_values=pixels,
                  image_grid_thw=torch.tensor([[1, 2, 2]]))
    with torch.no_grad():
        a, b = ref(**inputs).logits, got(**inputs).logits
        text_only = got(input_ids=inputs["input_ids"]).logits
    assert (a - b).abs().max() <= 1e-4 * a.abs().max()
    assert (b - text_only).abs().max() > 0.01 * b.abs().max()


def test_a_vision_tower_no_group_divides_does_not_block_the_language_model(tmp_path):
    """The tower is written as read (in ``ignore``): its widths are not checked against the groups."""
    import transformers

    from families import TEXT, VISION_FAMILIES, save_random

    cls, text, vision, other = VISION_FAMILIES["Qwen2.5-VL"]
    config = getattr(transformers, cls)(text_config={**TEXT, **text},
                                        vision_config=dict(vision, hidden_size=48, intermediate_size=96), **other)
    folder = save_random(config, tmp_path / "vl")
    out = quantkit.quantize(str(folder), "w4a16-g64").save(tmp_path / "out")
    import json
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert any(n.startswith("model.visual.") for n in ignore)
