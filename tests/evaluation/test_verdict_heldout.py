"""The default limits on a measurement they were not derived from.

``DEFAULT_LIMITS`` were set on the default suite's figures for SmolLM2's RTN checkpoints
(``smollm2_measured.json``). ``smollm2_heldout_measured.json`` is a separate run of the same three
checkpoints on English texts that neither the default suite nor the calibration set reads (its
``source`` says which, and the command: ``benchmarks/heldout_verdict.py``). The decisions the
product claims must hold there too: W8A16 and FP8_DYNAMIC GO on English, W4A16 g64 RTN NO-GO on
every English text slice. Where a run contradicts a claim, the test says so (a strict xfail with
the figures) and the limits stay as they are.
"""
import json
from pathlib import Path

import pytest

from quantkit.evaluation.languages import LanguageGate, slice_language
from quantkit.evaluation.slices import DEFAULT_SUITE
from quantkit.evaluation.verdict import GO, NOGO, REVIEW, decide, within_noise

HELDOUT = json.loads((Path(__file__).with_name("smollm2_heldout_measured.json")).read_text())
MEASURED = HELDOUT["candidates"]
ENGLISH_CARD = LanguageGate(("en",), "model card")


def heldout_verdict(candidate):
    slices = MEASURED[candidate]
    langs = {name: slice_language(name, []) for name in slices}
    return decide(slices, not_gated={n: ENGLISH_CARD.why_not() for n, lang in langs.items()
                                     if not ENGLISH_CARD.gates(lang)})


def test_the_measurement_is_of_other_texts():
    assert "benchmarks/heldout_verdict.py" in HELDOUT["source"]
    for candidate, slices in MEASURED.items():
        assert not set(slices) & set(DEFAULT_SUITE), candidate
        assert {slice_language(name, []) for name in slices} == {"en"}
        assert all(s["tokens"] > 1000 for s in slices.values() if "tokens" in s)


@pytest.mark.parametrize("candidate, decision", [("w8a16", GO), ("fp8_dynamic", GO), ("w4a16-g64", NOGO)])
def test_defaults_on_texts_they_were_not_set_on(candidate, decision):
    v = heldout_verdict(candidate)
    assert v.decision == decision, [r.text() for r in v.reasons]


def test_fp8_extraction_drop_is_within_the_noise_of_12_prompts():
    """FP8_DYNAMIC's extraction F1 on heldout-numbers-en drops by 0.069, past the REVIEW limit 0.05,
    over 12 prompts whose interval holds the limit: a measure over a few prompts is gated on its
    interval, so it is listed as noise and does not decide. Decided on its value it would be REVIEW."""
    slices = MEASURED["fp8_dynamic"]
    drop = slices["heldout-numbers-en"]
    assert drop["extract_f1_drop"] > 0.05 and drop["extract_f1_drop_ci"][0] <= 0.05 <= drop["extract_f1_drop_ci"][1]
    noise = within_noise(slices)
    assert ("heldout-numbers-en", "extract_f1_drop", "prompts") in {(n["slice"], n["measure"], n["over"]) for n in noise}
    by_value = {n: {m: x for m, x in vals.items() if not m.endswith("_ci")} for n, vals in slices.items()}
    assert decide(by_value).decision == REVIEW


TEACHER_FORCED = ("kl_mean", "top1_agreement", "ppl_increase", "focus_kl_mean", "focus_top1_agreement",
                  "kl_worst_bucket", "kl_last_bucket")


def test_fp8_teacher_forced_measures_stay_go():
    """The measures over every scored token (thousands a slice, unlike the 256 greedy tokens and 12
    extraction prompts) keep FP8_DYNAMIC inside every REVIEW limit on the held-out texts."""
    only = {n: {m: v for m, v in vals.items() if m in TEACHER_FORCED} for n, vals in MEASURED["fp8_dynamic"].items()}
    v = decide(only)
    assert v.decision == GO, [r.text() for r in v.reasons]


def test_w4_rtn_fails_every_english_text_slice():
    v = heldout_verdict("w4a16-g64")
    text_slices = {n for n, vals in MEASURED["w4a16-g64"].items() if "kl_mean" in vals}
    assert len(text_slices) == 4
    assert {n for n in text_slices if v.slices[n] == NOGO} == text_slices
