"""The integrity pass's allowances (integrity/figures.py: ``ALLOWANCES``, ``RECORDED``) on models
they were not measured on.

They were measured on the model of test_integrity_faults.py: a 2-layer Llama, hidden 128, its
weights and norms drawn with seed 0. Here: a Llama of another shape with other seeds, and tiny
Qwen3 (q/k norms), Phi-3 (fused qkv and gate/up projections), Gemma 3 (norms with a +1
offset) and Qwen3-MoE (experts) models, for each recipe kind the pass judges (round to nearest
and GPTQ, 4-bit groups, W8A8 and FP8, AWQ re-applied). A clean checkpoint names nothing, judged
with the conversion's row record and with the quantizer's allowance alone. Damage is named both
ways, by the reconstruction figure itself (not only by the scales' gain), so allowances loose
enough to hide it fail here too: a permuted run of codes with the record; without it every
scale of one module doubled (GPTQ W4 leaves +6 to +7 dB over its allowance), because a permuted
run of 256 bytes can stay inside GPTQ W4's own scatter there (2.9 dB under on the hidden-96 Llama).
"""
import pytest
import torch
from arch_configs import tiny_config
from model_factory import make_outlier_llama_dir, random_ids
from moe_models import make_moe_dir
from planted import doubled, plant, shuffled_run

import quantkit
from quantkit.evaluation.eval_result import flagged_measures
from quantkit.evaluation.integrity import check_checkpoint
from quantkit.evaluation.verdict import GO, NOGO, REVIEW, Thresholds, decide

W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 16,
      "actorder": "weight", "observer": "mse"}
GPTQ_W4 = {"group_0": {"targets": ["Linear"], "weights": W4}}
RECIPES = {
    "w4a16-rtn": {"scheme": "W4A16", "group_size": 16},
    "w4a16-gptq": {"config_groups": GPTQ_W4, "steps": ["gptq"]},
    "w8a8-gptq": {"scheme": "W8A8", "steps": ["gptq"]},
    "fp8-rtn": {"scheme": "FP8"},
    "awq-gptq": {"config_groups": GPTQ_W4, "steps": ["awq", "gptq"]},
}
MODULE = "model.layers.1.self_attn.o_proj"
VOCAB = 128   # the smallest of the models' vocabularies


def _tiny(path, arch: str, seed: int):
    """``arch``'s tiny config, weights N(0, 0.05) and every norm channel spread by N(0, 0.3)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch), dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
            elif p.ndim >= 2:
                p.normal_(0.0, 0.05)
    model.save_pretrained(path)
    return path


MODELS = {
    "llama-hidden96-seed7": lambda p: make_outlier_llama_dir(p, outliers=3, factor=20.0, spread=1.0, seed=7,
                                                             hidden=96, intermediate=192, weight_seed=7),
    "qwen3": lambda p: _tiny(p, "Qwen3ForCausalLM", seed=1),
    "phi3": lambda p: _tiny(p, "Phi3ForCausalLM", seed=2),
    "gemma3": lambda p: _tiny(p, "Gemma3ForCausalLM", seed=3),
    "qwen3-moe": lambda p: make_moe_dir(p, "Qwen3MoeForCausalLM", seed=4),
}


@pytest.fixture(scope="module", params=list(MODELS))
def converted(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    src = MODELS[request.param](root / "src")
    calib = random_ids(16, 32, vocab=VOCAB, seed=5)
    out = {}
    for name, r in RECIPES.items():
        recipe = {"version": 1, "calibration": {"num_samples": 16, "max_seq_len": 32}, **r}
        out[name] = quantkit.quantize(str(src), recipe, calibration=calib).save(root / name)
    return src, out


def judge(src, ckpt, use_record: bool):
    report = check_checkpoint(src, ckpt, use_record=use_record)
    verdict = decide(flagged_measures(report, Thresholds()))
    return report, verdict, {r.slice.removeprefix("integrity:") for r in verdict.reasons}


def _codes(report) -> str:
    return "weight_packed" if report.modules[MODULE]["format"] == "pack-quantized" else "weight"


@pytest.mark.parametrize("name", RECIPES)
def test_a_clean_checkpoint_names_nothing(converted, name):
    src, out = converted
    for use_record in (True, False):
        report, verdict, named = judge(src, out[name], use_record)
        assert verdict.decision == GO and not named, (use_record, [r.text() for r in verdict.reasons])
        assert not report.fallback and not report.tensors and MODULE in report.modules
        assert all((m["expected_from"] == "rows") == use_record for m in report.modules.values())


@pytest.mark.parametrize("name", RECIPES)
def test_damage_is_named_by_the_reconstruction(converted, tmp_path, name):
    src, out = converted
    codes = "weight_packed" if check_checkpoint(src, out[name]).modules[MODULE]["format"] == "pack-quantized" \
        else "weight"
    for use_record, leaf, change in ((True, codes, shuffled_run), (False, "weight_scale", doubled)):
        bad = plant(out[name], tmp_path / leaf, f"{MODULE}.{leaf}", change)
        report, verdict, named = judge(src, bad, use_record)
        assert verdict.decision in (REVIEW, NOGO) and named == {MODULE}, (use_record, named)
        figures = report.modules[MODULE]
        assert max(figures["recon_excess_db"], figures["recon_unit_excess_db"]) > 0, (use_record, figures)
