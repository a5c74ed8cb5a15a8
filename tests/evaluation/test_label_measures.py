"""Label tasks (labels.py) and their measures (measures/labels.py): the rule that makes a task a
label task, the two measures on hand-made replies, and on the second synthetic log (a sentiment
classifier's traffic) a clean 8-bit SmolLM2 passes their limits where a planted fault that
changes the labels breaches them."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from quantkit.evaluation.backends.base import Continuation, LabelRuns, ScoredSlice
from quantkit.evaluation.forced import ForcedResult, ItemStats
from quantkit.evaluation.label_tasks import LABEL_MIN_ROWS, label_set, reply_encoded
from quantkit.evaluation.measures import GO, MEASURES, measure_values

ROOT = Path(__file__).resolve().parents[2]


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def words(s: str) -> int:
    return len(s.split())


def test_a_task_of_short_replies_from_a_small_set_is_a_label_task():
    replies = ["positive"] * 30 + ["negative"] * 25 + [None] * 50 + ["I cannot tell, the review is mixed"] * 3
    assert label_set(replies, words) == ("positive", "negative")       # 55 of 58 replies: 95%
    # a label that needs more than four tokens does not count towards the set
    assert label_set(["a b c d e"] * 30 + ["yes"] * 10, words) == ()
    # more than 16 labels in common use, or too few rows to show a set: not a label task
    assert label_set([f"class{i % 20}" for i in range(200)], words) == ()
    assert label_set(["yes"] * (LABEL_MIN_ROWS - 1), words) == ()
    assert label_set([f"answer number {i}" for i in range(100)], lambda s: 1 / 0) == ()   # decided uncounted


def test_label_measures_on_hand_made_replies():
    replies = [Continuation([1], [5, 2], [5, 2], 5), Continuation([1], [6], [7, 3], 5),
               Continuation([1], [8], [9], 5)]
    p = [(0.9, 0.8), (0.5, 0.1), (0.4, 0.4)]       # each model's probability of the baseline's reply tokens
    items = [ItemStats(f"label-{k}", tokens=2, nll_base=-2 * math.log(b), nll_cand=-2 * math.log(c))
             for k, (b, c) in enumerate(p)]
    # the third baseline reply gives no label: its fork is not a label changed
    runs = LabelRuns(replies, ForcedResult(items), ["yes", "no", "i think"], ["yes", "maybe", "i guess"], ("yes", "no"))
    v = measure_values(ScoredSlice(labels=runs))
    assert v["label_agreement"] == 0.5
    assert v["label_prob_drop"] == pytest.approx((0.9 + 0.5 + 0.4) / 3 - (0.8 + 0.1 + 0.4) / 3)
    unlabelled = LabelRuns(replies[2:], ForcedResult(items[2:]), ["i think"], ["i guess"], ("yes", "no"))
    assert "label_agreement" not in measure_values(ScoredSlice(labels=unlabelled))
    assert "label_agreement" not in measure_values(ScoredSlice())
    # the baseline's reply, scored with the end token it stopped at; a cut-off reply without one
    e = reply_encoded(Continuation([1, 2, 3], [5, 6], [5, 6], 5), eos=0, k=0)
    assert e.ids == [1, 2, 3, 5, 6, 0] and e.scored == [False] * 3 + [True] * 3
    assert reply_encoded(Continuation([1], [5, 6], [5], 2), eos=0, k=1).ids == [1, 5, 6]


@pytest.mark.slow
def test_on_the_second_log_the_label_measures_separate_a_label_fault_from_a_clean_checkpoint(tmp_path):
    import torch
    from tiny import fake_quant_linears

    from quantkit.evaluation import SuiteOptions, evaluate
    from quantkit.evaluation.business import read_business
    from quantkit.evaluation.checkpoint import load_model, load_tokenizer
    from quantkit.inputs.embedded_model import default_model_dir

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        folder = default_model_dir()
        tok, base = load_tokenizer(folder), load_model(folder)
        log = tmp_path / "second.jsonl"
        log.write_text("".join(json.dumps(r) + "\n" for r in _bench("calibration_fidelity").label_log(160, seed=3)))
        opts = SuiteOptions(gen_prompts=0, business_rows=48)
        slices = read_business(log, tok, opts.business_rows).slices
        assert [s.name for s in slices if s.label_replies] == ["business:classification"]
        [labelled] = [s for s in slices if s.label_replies]
        assert set(labelled.label_replies) == {"positive", "negative", "neutral"}
        fault = _bench("business_evidence").norm_fault(base, tok)
        got = {name: evaluate(base, cand, tok, suite=[labelled], max_len=2048, options=opts, progress=False)
               .slices["business:classification"]
               for name, cand in (("w8a16-rtn", fake_quant_linears(base, 8)), ("fault", fault))}
    finally:
        torch.set_num_threads(threads)
    shown = {name: {k: v[k] for k in ("label_agreement", "label_prob_base", "label_prob_drop")} for name, v in got.items()}
    for m in ("label_agreement", "label_prob_drop"):
        assert MEASURES[m].limit.level(got["w8a16-rtn"][m]) == GO, (m, shown)
    assert MEASURES["label_agreement"].limit.level(got["fault"]["label_agreement"]) != GO, shown
    # most baseline replies give a label; the rest (free text) are left out of the agreement
    assert 24 <= got["w8a16-rtn"]["label_rows"] <= got["w8a16-rtn"]["rows"] == 48
