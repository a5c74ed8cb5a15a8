"""A model calibrated on one task, damaged only on the kinds of text outside its calibration set:
the per-slice limits turn the verdict NO-GO on those slices, although the calibrated task's slice
is GO and the mean over slices stays under the NO-GO limit (a gate on the mean would pass it)."""
from __future__ import annotations

from quantkit.evaluation.verdict import DEFAULT_LIMITS, GO, NOGO, REVIEW, decide

# business slices of a traffic log (tasks) and two public slices; KL in nats
TRAFFIC = {"business:classification": 0.030, "business:chat": 0.035, "business:code": 0.040,
           "business:translation": 0.038, "business:summarisation": 0.036, "numbers-en": 0.042, "code-en": 0.039}
# planted: calibrated on classification rows alone, its own slice as good as before, three slices
# outside the set past the REVIEW or the NO-GO limit, the rest unchanged
ONE_TASK = {**TRAFFIC, "business:classification": 0.028, "business:chat": 0.071, "business:translation": 0.112,
            "business:summarisation": 0.066}


def _measures(kl: dict[str, float]) -> dict[str, dict]:
    return {s: {"kl_mean": v, "tokens": 4096} for s, v in kl.items()}


def test_the_traffic_calibrated_model_is_go():
    v = decide(_measures(TRAFFIC))
    assert v.decision == GO and v.reasons == []


def test_damage_outside_the_calibration_set_is_caught_slice_by_slice():
    v = decide(_measures(ONE_TASK))
    assert v.decision == NOGO
    assert v.slices["business:classification"] == GO
    assert {s for s, lv in v.slices.items() if lv != GO} == {"business:chat", "business:translation",
                                                              "business:summarisation"}
    assert v.slices["business:translation"] == NOGO and v.slices["business:chat"] == REVIEW
    assert v.reasons[0].text() == "business:translation: kl_mean 0.112 > 0.1"
    # the mean over slices is under the NO-GO limit: only the per-slice limits see the damage
    assert sum(ONE_TASK.values()) / len(ONE_TASK) < DEFAULT_LIMITS["kl_mean"].nogo
