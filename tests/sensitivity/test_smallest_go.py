"""The smallest GO plan: the bisection (pure), the search on a tiny Llama, and ``convert --budget go``."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import quantkit
from quantkit.errors import QuantkitError
from quantkit.recipe import load_recipe
from quantkit.sensitivity.planner import Plan
from quantkit.workflows import evaluate
from quantkit.workflows.smallest_go import RESULT_FILE, Trial, bisect_go, smallest_go

from model_factory import make_llama_dir, random_ids


def oracle(threshold: float, calls: list):
    """GO from ``threshold`` bits up; a plan spends a little under its budget, as the planner's do."""
    def trial(budget: float) -> Trial:
        calls.append(budget)
        bits = budget - 0.01
        return Trial(budget, bits, int(bits * 1000), 1.0 / bits, "GO" if bits >= threshold else "NO-GO")
    return trial


@pytest.mark.parametrize("threshold", [4.3, 4.9, 5.55, 6.01, 7.2, 7.95])
def test_bisection_finds_the_smallest_go_within_tolerance(threshold):
    calls: list = []
    s = bisect_go(4.25, 8.0, 0.25, oracle(threshold, calls))
    assert s.found is not None and s.found.decision == "GO" and s.found.bits_per_weight >= threshold
    assert s.found.bits_per_weight - threshold <= 0.25 + 0.01
    assert all(t.bits_per_weight >= s.found.bits_per_weight for t in s.trials if t.decision == "GO")
    assert len(calls) <= 2 + math.ceil(math.log2((8.0 - 4.25) / 0.25))
    assert calls[:2] == [8.0, 4.25]


def test_bisection_without_a_go_stops_at_the_high_end_and_a_go_low_end_is_the_answer():
    calls: list = []
    s = bisect_go(4.25, 8.0, 0.25, oracle(9.0, calls))
    assert s.found is None and calls == [8.0]
    calls.clear()
    s = bisect_go(4.25, 8.0, 0.25, oracle(4.0, calls))
    assert s.found.budget_bits == 4.25 and calls == [8.0, 4.25]


def recipe(**go) -> dict:
    return {"scheme": "W4A16", "group_size": 32,
            "mixed": {"smallest_go": go, "candidates": ["W4_G32", "W8_CHANNEL", "KEEP"], "tokens": 256}}


def test_search_keeps_only_the_smallest_go_checkpoint(tmp_path):
    model = make_llama_dir(tmp_path / "llama")
    work = tmp_path / "work"
    work.mkdir()
    evaluated: list[float] = []

    def verdict(folder):   # GO from 6 bits per planned weight up, read off the checkpoint's own plan
        bits = Plan.load(folder / "plan.json").bits_per_weight
        evaluated.append(bits)
        return "GO" if bits >= 6.0 else "NO-GO"

    q, search = smallest_go(model, load_recipe(recipe(tolerance_bits=0.5)), random_ids(8, 64), evaluate=verdict,
                            workdir=work, log=lambda _: None)
    assert search.found is not None and search.found.bits_per_weight >= 6.0
    assert search.found.bits_per_weight == min(t.bits_per_weight for t in search.trials if t.decision == "GO")
    nogo = max(t.budget_bits for t in search.trials if t.decision != "GO")
    assert search.found.bits_per_weight - nogo <= 0.5
    assert len(evaluated) == len(set(evaluated))                 # one evaluation per distinct plan
    path = q.save(tmp_path / "out")
    assert Plan.load(path / "plan.json").bits_per_weight == pytest.approx(search.found.bits_per_weight, abs=1e-4)
    saved = json.loads((path / RESULT_FILE).read_text())
    assert saved["found"]["nbytes"] == search.found.nbytes and len(saved["trials"]) == len(search.trials)
    del q
    assert list(work.iterdir()) == []                            # every other trial's folder is gone


def test_smallest_go_is_refused_where_it_cannot_run(tmp_path):
    with pytest.raises(QuantkitError, match="mixed.smallest_go: give a budget or smallest_go, not both"):
        load_recipe({"scheme": "W4A16", "mixed": {"smallest_go": {}, "budget_bits": 5.0}})
    with pytest.raises(QuantkitError, match=r"mixed.smallest_go.high_bits: must be above low_bits"):
        load_recipe(recipe(low_bits=6.0, high_bits=5.0))
    with pytest.raises(QuantkitError, match=r"mixed.smallest_go: .*--budget go"):
        quantkit.quantize(make_llama_dir(tmp_path / "llama"), recipe(), calibration=random_ids(4, 32))


def _invoke(args):
    from quantkit.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])


def fake_evaluation(model, folder, recipe, calib=None, lang="en", say=print):
    """The verdict by size, GO from 7 bits per planned weight, returned as a value; the report the
    model card reads is written beside it."""
    decision = "GO" if Plan.load(folder / "plan.json").bits_per_weight >= 7.0 else "NO-GO"
    out = folder / "eval"
    out.mkdir()
    (out / "report.json").write_text(json.dumps({"decision": decision}))
    return evaluate.Evaluated(SimpleNamespace(decision=decision, warnings=[], integrity=None), out)


@pytest.mark.parametrize("flags, message", [(["--budget", "lots"], "--budget: expected bits per weight"),
                                            (["--budget", "go", "--no-eval"], "--budget go: needs the evaluation")])
def test_cli_budget_flag_errors_are_one_line(text_model, tmp_path, flags, message):
    model, calib = text_model
    r = _invoke(["convert", model, "--recipe", "w4a16-g64", "--group-size", "32", "--calib", calib,
                 "--out", tmp_path / "out", *flags])
    assert r.exit_code == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "out").exists()


def test_cli_budget_go_writes_the_smallest_go_plan_and_says_what_it_tried(text_model, tmp_path, monkeypatch):
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", fake_evaluation)
    model, calib = text_model
    r = _invoke(["convert", model, "--recipe", "w4a16-g64", "--group-size", "32", "--budget", "go", "--calib", calib,
                 "--num-samples", "8", "--max-seq-len", "48", "--out", tmp_path / "out"])
    assert r.exit_code == 0, r.output
    found = json.loads((tmp_path / "out" / RESULT_FILE).read_text())["found"]
    assert found["bits_per_weight"] >= 7.0 and Plan.load(tmp_path / "out" / "plan.json").nbytes == found["nbytes"]
    assert f"smallest GO: {found['bits_per_weight']:.3f} bits per weight" in r.stdout
    assert json.loads((tmp_path / "out" / "eval" / "report.json").read_text())["decision"] == "GO"
    card = (tmp_path / "out" / "README.md").read_text()
    assert "**GO**" in card and "Not evaluated yet" not in card   # the kept plan's verdict is in its card
