"""What the reports show beside the numbers, on hand-made report.json dicts: each gated figure's
limit and margin, the per-layer spread of module errors, and the word catalogs."""
import pytest

from quantkit.common.i18n import LANGUAGES, Catalog
from quantkit.evaluation.report.content import layer_summary, short
from quantkit.evaluation.report.gating import gated_figures, headline_figures
from quantkit.evaluation.report.words import WORDS
from quantkit.evaluation.verdict import decide


def _data():
    return {"slices": {"numbers-en": {"kl_mean": 0.0351873, "top1_agreement": 0.95},
                       "long-en": {"kl_mean": 0.25, "top1_agreement": 0.5},
                       "numbers-zh": {"kl_mean": 0.9}},
            "verdict": {"not_gated": {"numbers-zh": "not gated (--languages: en)"}},
            "thresholds": {"kl_mean": {"review": 0.06, "nogo": 0.1, "higher_is_better": False},
                           "top1_agreement": {"review": 0.87, "nogo": 0.75, "higher_is_better": True},
                           "slices": {"long-en": {"kl_mean": {"review": 0.2, "nogo": 0.3}}}}}


def test_each_figure_stands_beside_the_limit_that_judges_it():
    figures = {(f.slice, f.measure): f for f in gated_figures(_data())}
    assert set(figures) == {("numbers-en", "kl_mean"), ("numbers-en", "top1_agreement"),
                            ("long-en", "kl_mean"), ("long-en", "top1_agreement")}   # numbers-zh does not gate
    inside = figures[("numbers-en", "kl_mean")]
    assert (inside.level, inside.limit, inside.sign) == ("GO", 0.06, "≤")
    assert inside.margin == pytest.approx(0.0248127) and short(inside.margin) == "0.0248"
    over = figures[("long-en", "kl_mean")]   # the slice's own REVIEW limit, 0.2, not the default 0.06
    assert (over.level, over.limit, over.sign) == ("REVIEW", 0.2, ">") and over.margin == pytest.approx(-0.05)
    low = figures[("long-en", "top1_agreement")]   # past the NO-GO limit: judged by it
    assert (low.level, low.limit, low.sign) == ("NO-GO", 0.75, "<") and low.margin == pytest.approx(-0.25)
    high = figures[("numbers-en", "top1_agreement")]
    assert (high.sign, high.margin) == ("≥", pytest.approx(0.08))


def test_a_figure_over_prompts_is_judged_on_its_interval_as_the_verdict_judges_it():
    """gen_agreement 0.12 is past its REVIEW limit 0.15, but its interval over prompts reaches 0.2:
    the gating table shows it GO with the margin of the interval's end, as the verdict decides it;
    without an interval it is judged on its value."""
    data = {"slices": {"names-en": {"gen_agreement": 0.12, "gen_agreement_ci": [0.06, 0.2]},
                       "code-en": {"gen_agreement": 0.12}},
            "verdict": {"not_gated": {}},
            "thresholds": {"gen_agreement": {"review": 0.15, "nogo": 0.1, "higher_is_better": True}}}
    figures = {f.slice: f for f in gated_figures(data)}
    noisy = figures["names-en"]
    assert (noisy.level, noisy.interval, noisy.sign) == ("GO", (0.06, 0.2), "≥")
    assert noisy.margin == pytest.approx(0.05) and decide(data["slices"]).slices["names-en"] == noisy.level
    plain = figures["code-en"]
    assert (plain.level, plain.interval, plain.margin) == ("REVIEW", None, pytest.approx(-0.03))


def test_the_headline_is_each_slices_tightest_figure_worst_first():
    top = headline_figures(gated_figures(_data()))
    # long-en: top1 is 33% past its limit, kl_mean 25%; numbers-en: top1 9% inside, kl_mean 41%
    assert [(f.slice, f.measure) for f in top] == [("long-en", "top1_agreement"), ("numbers-en", "top1_agreement")]


def test_module_errors_are_summarised_per_layer():
    kinds = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    errors = {f"model.layers.{layer}.x.{k}": 20.0 + layer - i for layer in range(30) for i, k in enumerate(kinds)}
    errors["lm_head"] = 3.0   # outside the decoder layers: not a layer's
    rows = layer_summary(errors)
    assert len(rows) == 30 and [r[0] for r in rows] == list(range(30))
    assert rows[4] == (4, 7, 18.0, 21.0, 24.0)   # layer, modules, worst, median, best
    assert layer_summary({"model.layers.0.a": 1.0, "model.layers.0.b": 4.0})[0][3] == 2.5   # even count


def test_every_message_has_both_languages_and_chinese_is_not_english():
    same = [k for k in WORDS if WORDS.text("en", k) == WORDS.text("zh", k) and WORDS.text("en", k)]
    assert same == []
    with pytest.raises(ValueError, match="one text per language"):
        Catalog({"title": ("only English",)})
    assert LANGUAGES == ("en", "zh")
