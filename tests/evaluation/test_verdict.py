import json
from pathlib import Path

import pytest

from quantkit.errors import QuantkitError
from quantkit.evaluation.languages import LanguageGate, slice_language
from quantkit.evaluation.verdict import DEFAULT_LIMITS, GO, NOGO, REVIEW, Thresholds, decide, noise_text, within_noise


def test_levels_follow_the_documented_defaults():
    v = decide({"a": {"kl_mean": 0.059}, "b": {"kl_mean": 0.07}, "c": {"kl_mean": 0.11},
                "d": {"top1_agreement": 0.88}, "e": {"top1_agreement": 0.85}, "f": {"top1_agreement": 0.7}})
    assert v.slices == {"a": GO, "b": REVIEW, "c": NOGO, "d": GO, "e": REVIEW, "f": NOGO}
    assert v.decision == NOGO
    assert [r.slice for r in v.reasons][:2] == ["c", "f"]  # NO-GO reasons first


def test_all_go_and_unmeasured_slices():
    v = decide({"a": {"kl_mean": 0.001, "tokens": 100}, "b": {}})
    assert v.decision == GO and v.reasons == []


def test_overrides_global_and_per_slice():
    t = Thresholds.from_dict({"kl_mean": {"review": 0.001},
                              "slices": {"long-en": {"kl_mean": {"review": 0.5, "nogo": 0.9}}}})
    v = decide({"numbers-en": {"kl_mean": 0.01}, "long-en": {"kl_mean": 0.2}}, t)
    assert v.slices == {"numbers-en": REVIEW, "long-en": GO}
    assert t.limits["kl_mean"].nogo == DEFAULT_LIMITS["kl_mean"].nogo


def test_a_measure_over_prompts_counts_only_past_its_whole_interval():
    """Greedy agreement over 8 prompts moves with other prompts: a mean past a limit whose interval
    over prompts holds the limit is within noise (GO, listed, not counted); one whose whole interval
    is past it breaches, the interval in its reason. A measure over rows (kl_mean) still decides on
    its value, whatever its interval."""
    noisy = {"names-en": {"gen_agreement": 0.12, "gen_agreement_ci": [0.06, 0.2]}}
    v = decide(noisy)
    assert v.decision == GO and v.reasons == []
    noise = within_noise(noisy)
    assert [(n["limit_level"], n["limit"], n["over"]) for n in noise] == [(REVIEW, 0.15, "prompts"), (NOGO, 0.1, "prompts")]
    assert noise_text(noise[0]).endswith("within noise, not counted")

    v = decide({"names-en": {"gen_agreement": 0.04, "gen_agreement_ci": [0.0, 0.08]},
                "numbers-en": {"extract_f1_drop": 0.09, "extract_f1_drop_ci": [0.06, 0.12]}})
    assert v.slices == {"names-en": NOGO, "numbers-en": REVIEW}
    assert [r.interval for r in v.reasons] == [(0.0, 0.08), (0.06, 0.12)]
    assert "(95% interval over prompts 0-0.08, all of it < 0.1)" in v.reasons[0].text()
    assert v.to_dict()["reasons"][1]["interval"] == [0.06, 0.12]

    # without an interval (a figure stored before intervals, a single prompt) the value decides
    assert decide({"names-en": {"gen_agreement": 0.12}}).decision == REVIEW
    assert decide({"a": {"kl_mean": 0.07, "kl_mean_ci": [0.05, 0.09]}}).decision == REVIEW


@pytest.mark.parametrize("bad, key", [
    ({"kl_maen": {"review": 1}}, "eval.thresholds.kl_maen"),
    ({"kl_mean": {"reveiw": 1}}, "eval.thresholds.kl_mean"),
    ({"kl_mean": {"review": "high"}}, "eval.thresholds.kl_mean.review"),
    ({"slices": {"x": {"nope": {"review": 1}}}}, "eval.thresholds.slices.x.nope"),
])
def test_bad_overrides_name_the_key(bad, key):
    with pytest.raises(QuantkitError, match=key.replace(".", r"\.")):
        Thresholds.from_dict(bad)


# --- the defaults against what they were derived from -------------------------------------

MEASURED = json.loads((Path(__file__).with_name("smollm2_measured.json")).read_text())["candidates"]
ENGLISH_CARD = LanguageGate(("en",), "model card")


def smollm2_verdict(candidate, gate=ENGLISH_CARD):
    slices = MEASURED[candidate]
    langs = {name: slice_language(name, []) for name in slices}
    return decide(slices, not_gated={n: gate.why_not() for n, lang in langs.items() if not gate.gates(lang)})


@pytest.mark.parametrize("candidate, decision", [("w8a16", GO), ("fp8_dynamic", GO), ("w4a16-g64", NOGO)])
def test_defaults_on_the_measured_smollm2_suite(candidate, decision):
    """Acceptance 1 on the full suite's numbers (benchmarks/RESULTS.md): English gates."""
    v = smollm2_verdict(candidate)
    assert v.decision == decision, [r.text() for r in v.reasons]
    if candidate == "w4a16-g64":  # the slice table shows where it degrades: every English text slice
        assert {s for s, lv in v.slices.items() if lv == NOGO and s.endswith("-en")} == {
            "numbers-en", "code-en", "names-en", "long-en"}
        assert v.slices["knowledge-en"] == GO


def test_fp8_on_chinese_is_shown_not_gated():
    v = smollm2_verdict("fp8_dynamic")
    assert {r.slice for r in v.informational if r.level == NOGO} == {"numbers-zh"}
    assert v.slices["names-zh"] == v.slices["code-zh"] == REVIEW
    assert smollm2_verdict("fp8_dynamic", LanguageGate()).decision == NOGO  # with every language gating
    assert smollm2_verdict("w8a16", LanguageGate()).decision == GO


def test_defaults_keep_a_margin_over_fp8_on_english():
    """The REVIEW limits are not tuned to the last digit of FP8's numbers: a candidate 1.2x
    worse than FP8_DYNAMIC on every English slice (1.2x the KL, ppl increase and top-1
    disagreement; greedy agreement, noisier and with an absolute margin, 0.06 lower) is GO."""
    def worse(m, v):
        if m == "gen_agreement":
            return v - 0.06
        if m not in DEFAULT_LIMITS:
            return v
        return 1 - 1.2 * (1 - v) if DEFAULT_LIMITS[m].higher_is_better else 1.2 * v
    v = decide({n: {m: worse(m, x) for m, x in vals.items()}
                for n, vals in MEASURED["fp8_dynamic"].items() if n.endswith("-en")})
    assert v.decision == GO, [r.text() for r in v.reasons]


# long-en at 2048 tokens on SmolLM2 (benchmarks/RESULTS.md, KV cache, KL by position):
# each candidate's mean, worst and deepest bucket
LONG_EN_2048 = {"fp8_dynamic": {"kl_mean": 0.0308, "kl_worst_bucket": 0.0790, "kl_last_bucket": 0.0271},
                "w4a16-g64": {"kl_mean": 0.406, "kl_worst_bucket": 0.763, "kl_last_bucket": 0.385},
                "kv fp8-head": {"kl_mean": 0.0168, "kl_worst_bucket": 0.0291, "kl_last_bucket": 0.0205}}


def test_the_deepest_bucket_limit_against_what_it_was_set_on():
    """FP8_DYNAMIC weights and an FP8 KV cache stay GO on the deepest bucket with a 2x margin,
    W4 RTN is NO-GO on it; a candidate whose deepest bucket alone is 1.2x past the NO-GO limit is
    NO-GO naming that bucket, though its mean and worst bucket pass."""
    lim = DEFAULT_LIMITS["kl_last_bucket"]
    for name in ("fp8_dynamic", "kv fp8-head"):
        assert decide({"long-en": LONG_EN_2048[name]}).decision == GO
        assert LONG_EN_2048[name]["kl_last_bucket"] * 2 < lim.review
    v = decide({"long-en": LONG_EN_2048["w4a16-g64"]})
    assert v.decision == NOGO and ("long-en", "kl_last_bucket", NOGO) in {(r.slice, r.measure, r.level) for r in v.reasons}
    late = decide({"long-en": {"kl_mean": 0.05, "kl_worst_bucket": 0.10 * 1.2, "kl_last_bucket": 0.10 * 1.2}})
    assert late.decision == NOGO and [r.measure for r in late.reasons if r.level == NOGO] == ["kl_last_bucket"]
