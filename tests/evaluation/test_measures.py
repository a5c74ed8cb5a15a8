"""The measures read nothing but a ``ScoredSlice``: what any scoring backend returns for a slice
is enough to compute them, by the formulas their docstrings give."""
import math
import subprocess
import sys

import pytest

from quantkit.evaluation.bootstrap import prompt_intervals
from quantkit.evaluation.backends.base import Continuation, PairedRuns, ScoredSlice
from quantkit.evaluation.forced import ForcedResult, ItemStats
from quantkit.evaluation.measures import MEASURES, Measure, measure_values, register, table_columns


def _rows() -> list[ItemStats]:
    return [ItemStats("a", tokens=4, nll_base=4.0, nll_cand=4.4, kl_sum=0.2, top1=3, focus_tokens=2,
                      focus_kl_sum=0.15, focus_top1=1),
            ItemStats("b", tokens=6, nll_base=6.0, nll_cand=6.0, kl_sum=0.1, top1=6)]


def test_measures_of_a_hand_built_slice():
    scored = ScoredSlice(
        forced=ForcedResult(_rows()),
        generations=[Continuation([1], [5, 6, 7, 8], [5, 6, 0, 0], 4), Continuation([2], [9], [9], 4)],
        choices=PairedRuns([{"answer": 0}, {"answer": 1}], [0, 1], [0, 0]),
        extraction=PairedRuns([{}, {}], [{"f1": 1.0}, {"f1": 0.5}], [{"f1": 0.5}, {"f1": 0.5}]),
        code=None)
    v = measure_values(scored)
    assert v["kl_mean"] == pytest.approx(0.3 / 10) and v["top1_agreement"] == pytest.approx(0.9)
    assert v["ppl_increase"] == pytest.approx(math.exp(0.4 / 10) - 1)
    assert v["focus_kl_mean"] == pytest.approx(0.075) and v["focus_top1_agreement"] == pytest.approx(0.5)
    assert v["gen_agreement"] == pytest.approx((0.5 + 1.0) / 2)
    assert v["mc_accuracy_drop"] == pytest.approx(0.5) and v["extract_f1_drop"] == pytest.approx(0.25)
    # what the slice lacks is not measured: no code, no position buckets, nothing external
    assert not {"code_pass_drop", "kl_last_bucket", "kl_worst_bucket", "lm_eval_acc_drop"} & set(v)


def test_measures_over_prompts_get_an_interval_over_prompts():
    """gen_agreement and extract_f1_drop are means over a few prompts: each gets a percentile
    interval of its per-prompt values resampled; the teacher-forced measures get none here."""
    scored = ScoredSlice(
        forced=ForcedResult(_rows()),
        generations=[Continuation([1], [5, 6, 7, 8], [5, 6, 0, 0], 4), Continuation([2], [9, 9, 9, 9], [9, 9, 9, 9], 4),
                     Continuation([3], [1, 2, 3, 4], [0, 2, 3, 4], 4)],
        extraction=PairedRuns([{}, {}], [{"f1": 1.0}, {"f1": 0.5}], [{"f1": 0.5}, {"f1": 0.5}]))
    ci = prompt_intervals(scored)
    assert set(ci) == {"gen_agreement_ci", "extract_f1_drop_ci"}
    assert ci["gen_agreement_ci"][0] == 0.0 and ci["gen_agreement_ci"][1] == 1.0   # all three resampled alike
    assert 0.0 <= ci["extract_f1_drop_ci"][0] < 0.25 < ci["extract_f1_drop_ci"][1] <= 0.5
    assert prompt_intervals(ScoredSlice(forced=ForcedResult(_rows()))) == {}


def test_an_empty_slice_has_no_measures():
    assert measure_values(ScoredSlice()) == {}


def test_a_measure_name_is_registered_once():
    with pytest.raises(ValueError, match="kl_mean"):
        register(Measure("kl_mean", False, 0.1, 0.2, evidence="a second one"))
    assert MEASURES["kl_mean"].review == 0.06


def test_table_columns_follow_the_shipped_order():
    keys = [k for k, _, _ in table_columns()]
    assert keys == ["tokens", "ppl_base", "ppl_cand", "ppl_increase", "kl_mean", "top1_agreement",
                    "focus_kl_mean", "focus_top1_agreement", "kl_worst_bucket", "kl_last_bucket", "gen_agreement",
                    "mc_accuracy_base", "mc_accuracy_cand", "extract_f1_base", "extract_f1_cand",
                    "code_pass_base", "code_pass_cand", "label_rows", "label_agreement", "label_prob_base",
                    "label_prob_cand", "label_prob_drop", "path_tokens", "path_ppl_own", "path_ppl_engine", "path_ppl_gap",
                    "path_top1", "path_kl_mean"]


def test_the_registry_loads_without_the_models_code():
    # the command line imports the verdict to register its commands: the measures must not pull
    # in torch or transformers with it
    code = ("import sys, quantkit.evaluation.verdict; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
