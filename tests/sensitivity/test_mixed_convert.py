"""A mixed conversion end to end on a tiny Llama: search, plan, convert, reuse for another budget.

What is checked on the written checkpoint, not on the plan alone: every Linear is packed in its
planned format, the planned weights' bytes on disk are within the budget, sensitivity.json and
plan.json sit beside the shards, and transformers + compressed-tensors load it with quantkit.load's
logits.
"""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open
from typer.testing import CliRunner

import quantkit
from quantkit.sensitivity import Sensitivity
from quantkit.sensitivity.planner import Plan, plan

from model_factory import random_ids
from reference_reader import relative_logit_error

BITS = {"W4_G32": 4, "W8_CHANNEL": 8}


def recipe(budget: float, **mixed) -> dict:
    return {"scheme": "W4A16", "group_size": 32,
            "mixed": {"budget_bits": budget, "candidates": ["W4_G32", "W8_CHANNEL", "KEEP"], "tokens": 256, **mixed}}


@pytest.fixture(scope="module")
def converted(tiny_llama, tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    q = quantkit.quantize(tiny_llama, recipe(7.0), calibration=random_ids(8, 64))
    return q.save(root / "ckpt")


def _tensor_bytes(path, members) -> int:
    total = 0
    with safe_open(path / "model.safetensors", "pt") as f:
        for k in f.keys():
            owner, _, leaf = k.rpartition(".")
            if owner in members and leaf != "bias":
                t = f.get_tensor(k)
                total += t.numel() * t.element_size()
    return total


def test_checkpoint_holds_the_plan_within_budget(converted):
    sens = Sensitivity.load(converted / "sensitivity.json")
    p = Plan.load(converted / "plan.json")
    assert p.budget == {"bits": 7.0} and p.bits_per_weight <= 7.0
    assert len(set(p.choice.values())) >= 2, p.choice   # a real mix at this budget
    members = {m: p.choice[u.name] for u in sens.units for m in u.members}
    on_disk = _tensor_bytes(converted, set(members))
    assert on_disk == p.nbytes and 8 * on_disk <= 7.0 * sens.params()
    qc = json.loads((converted / "config.json").read_text())["quantization_config"]
    model = quantkit.load(converted)
    for name, cand in members.items():
        module = model.get_submodule(name)
        if cand == "KEEP":
            assert not isinstance(module, quantkit.runtime.modules.QuantLinear) and name in qc["ignore"]
        else:
            assert module.scheme.weights.num_bits == BITS[cand], name
    log = json.loads((converted / "quantization_log.json").read_text())
    assert log["recipe"]["mixed"]["budget_bits"] == 7.0


def test_mixed_checkpoint_loads_in_transformers_with_compressed_tensors(converted):
    from transformers import AutoModelForCausalLM
    from transformers.quantizers.quantizer_compressed_tensors import CompressedTensorsHfQuantizer

    # compressed-tensors itself reads the mix: each Linear carries its planned scheme
    theirs = AutoModelForCausalLM.from_pretrained(converted)
    assert isinstance(theirs.hf_quantizer, CompressedTensorsHfQuantizer)
    sens = Sensitivity.load(converted / "sensitivity.json")
    choice = Plan.load(converted / "plan.json").choice
    planned = {m: choice[u.name] for u in sens.units for m in u.members}
    read = {}
    for name, cand in planned.items():
        scheme = getattr(theirs.get_submodule(name), "quantization_scheme", None)
        read[name] = "KEEP" if scheme is None else scheme.weights.num_bits
    assert read == {m: "KEEP" if c == "KEEP" else BITS[c] for m, c in planned.items()}
    assert len(set(read.values())) >= 2
    # and computes quantkit.load's logits
    assert relative_logit_error(converted, seed=9) <= 1e-3


def test_another_budget_reuses_the_search(converted, tiny_llama, tmp_path):
    sens = converted / "sensitivity.json"
    q = quantkit.quantize(tiny_llama, recipe(5.5, sensitivity=str(sens)))
    p = Plan.load(q.save(tmp_path / "five") / "plan.json")
    assert p == plan(Sensitivity.load(sens), budget_bits=5.5, candidates=["W4_G32", "W8_CHANNEL", "KEEP"])
    assert p.bits_per_weight <= 5.5 < Plan.load(converted / "plan.json").bits_per_weight


def _invoke(args):
    from quantkit.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def test_cli_convert_with_budget_and_sensitivity_ranking(text_model, tmp_path):
    model, calib = text_model
    r = _invoke(["convert", model, "--recipe", "w4a16-g64", "--group-size", "32", "--budget", "6", "--calib", calib,
                 "--num-samples", "8", "--max-seq-len", "48", "--out", tmp_path / "out", "--no-eval"])
    assert r.exit_code == 0, r.output
    assert "mixed precision: " in r.stderr and Plan.load(tmp_path / "out" / "plan.json").bits_per_weight <= 6
    r = _invoke(["sensitivity", model, "--recipe", "w4a16-g64", "--calib", calib, "--candidate", "W4_G32",
                 "--candidate", "W8_CHANNEL", "--tokens", "256", "--top", "3", "--out", tmp_path / "s.json"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    w4 = lines.index(next(x for x in lines if x.startswith("  W4_G32: 8 units")))
    shown = [float(x.split()[0]) for x in lines[w4 + 1: w4 + 4]]
    assert shown == sorted(shown, reverse=True) and len(shown) == 3
    assert Sensitivity.load(tmp_path / "s.json").ranking("W4_G32")[0][1] == pytest.approx(shown[0], rel=1e-3)


def test_report_section_lists_every_unit_with_its_format(converted, tmp_path):
    from quantkit.sensitivity.sensitivity_report import markdown, section

    data = section(converted)
    p = Plan.load(converted / "plan.json")
    assert {r["unit"]: r["format"] for r in data["units"]} == p.choice
    assert data["frontier"] is None   # no W4 g64 among these candidates: no rule to draw against
    text = "\n".join(markdown(data))
    assert text.startswith("## Mixed-precision plan") and all(u in text for u in p.choice)
    assert section(tmp_path) is None


def test_evaluation_report_of_a_mixed_checkpoint_shows_its_plan(converted, tmp_path):
    import sys
    from pathlib import Path

    from quantkit.evaluation.eval_result import EvalResult
    from quantkit.evaluation.verdict import Thresholds, decide

    sys.path.insert(0, str(Path(__file__).parents[1] / "evaluation"))
    from report_html import parse

    measures = {"numbers-en": {"kl_mean": 0.25, "top1_agreement": 0.8}, "code-en": {"kl_mean": 0.15, "top1_agreement": 0.9},
                "numbers-zh": {"kl_mean": 0.9, "top1_agreement": 0.5}}
    not_gated = {"numbers-zh": "not gated (--languages: en)"}

    def result(candidate):
        return EvalResult(meta={"baseline": "tiny", "candidate": str(candidate), "max_len": 64, "seconds_total": 1.0},
                          slices=measures, buckets={}, examples={}, verdict=decide(measures, None, not_gated),
                          thresholds=Thresholds())

    out = result(converted).save(tmp_path / "eval")
    data = json.loads((out / "report.json").read_text())
    p = Plan.load(converted / "plan.json")
    shown = data["mixed"]
    assert {r["unit"]: r["format"] for r in shown["units"]} == p.choice
    assert shown["measured_kl"] == pytest.approx(0.2)   # the gated slices only
    assert shown["plan"]["bits_per_weight"] == pytest.approx(p.bits_per_weight, rel=1e-5)
    md = (out / "report.md").read_text()
    assert "## Mixed-precision plan" in md and all(f"| {u} | {c} |" in md for u, c in p.choice.items())
    cells = parse((out / "report.html").read_text()).cells
    for i, r in enumerate(shown["units"]):
        assert float(cells[f"mixed.units.{i}.score"]) == r["score"]
    # no plan: no section; a plan without its sensitivity file: a warning, the report still written
    assert json.loads((result(tmp_path).save(tmp_path / "plain") / "report.json").read_text())["mixed"] is None
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "plan.json").write_text((converted / "plan.json").read_text())
    data = json.loads((result(broken).save(tmp_path / "b") / "report.json").read_text())
    assert data["mixed"] is None and any("sensitivity.json" in w for w in data["warnings"])
