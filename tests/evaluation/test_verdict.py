import pytest

from quantkit.errors import QuantkitError
from quantkit.evaluation.verdict import DEFAULT_LIMITS, GO, NOGO, REVIEW, Thresholds, decide


def test_levels_follow_the_documented_defaults():
    v = decide({"a": {"kl_mean": 0.019}, "b": {"kl_mean": 0.05}, "c": {"kl_mean": 0.11},
                "d": {"top1_agreement": 0.91}, "e": {"top1_agreement": 0.85}, "f": {"top1_agreement": 0.7}})
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


@pytest.mark.parametrize("bad, key", [
    ({"kl_maen": {"review": 1}}, "eval.thresholds.kl_maen"),
    ({"kl_mean": {"reveiw": 1}}, "eval.thresholds.kl_mean"),
    ({"kl_mean": {"review": "high"}}, "eval.thresholds.kl_mean.review"),
    ({"slices": {"x": {"nope": {"review": 1}}}}, "eval.thresholds.slices.x.nope"),
])
def test_bad_overrides_name_the_key(bad, key):
    with pytest.raises(QuantkitError, match=key.replace(".", r"\.")):
        Thresholds.from_dict(bad)
