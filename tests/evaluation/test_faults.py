"""Acceptance 2: planted faults get NO-GO and the reasons name the right slices; an 8-bit
fake-quantized copy of the same model gets GO."""
import pytest
from tiny import FAST, TINY_THRESHOLDS, _take
from tiny import broken_past, digits_scrambled, fake_quant_linears, mlp_at_2_bits, scaled_layer

from quantkit.evaluation import evaluate, load_suite
from quantkit.evaluation.slices import SuiteOptions
from quantkit.evaluation.verdict import GO, NOGO

OPTS = SuiteOptions(**{**FAST.__dict__, "gen_prompts": 0})
MAX_LEN = 2560


@pytest.fixture(scope="module")
def suite():
    # text slices only: the task measures have their own tests
    return [_take(s, 3) for s in load_suite("numbers-en,code-en,names-zh,long-en")]


def run(base, cand, tok, suite):
    return evaluate(base, cand, tok, suite=suite, max_len=MAX_LEN, thresholds=TINY_THRESHOLDS,
                    options=OPTS, progress=False)


def test_8bit_copy_is_go(base, tok, suite):
    r = run(base, fake_quant_linears(base, 8), tok, suite)
    assert r.decision == GO, [x.text() for x in r.verdict.reasons]
    assert all(v["kl_mean"] < 0.02 for v in r.slices.values())


@pytest.mark.parametrize("fault", ["layer_scaled_4x", "mlp_2_bits"])
def test_global_faults_fail_every_text_slice(base, tok, suite, fault):
    cand = scaled_layer(base, 1, 4.0) if fault == "layer_scaled_4x" else mlp_at_2_bits(base, 0)
    r = run(base, cand, tok, suite)
    assert r.decision == NOGO
    assert set(r.verdict.slices.values()) == {NOGO}
    named = {(x.slice, x.measure) for x in r.verdict.reasons if x.level == NOGO}
    assert {(s.name, "kl_mean") for s in suite} <= named


def test_fault_past_2k_tokens_names_only_the_long_slice(base, tok, suite):
    r = run(base, broken_past(base, position=2048, noise=3.0), tok, suite)
    assert r.decision == NOGO
    assert r.verdict.slices == {"numbers-en": GO, "code-en": GO, "names-zh": GO, "long-en": NOGO}
    assert any(x.slice == "long-en" and x.measure == "kl_worst_bucket" and x.level == NOGO
               for x in r.verdict.reasons)
    buckets = r.buckets["long-en"]
    early = [b["kl_mean"] for b in buckets if b["end"] <= 2048 and b["tokens"]]
    late = [b["kl_mean"] for b in buckets if b["start"] >= 2048 and b["tokens"]]
    assert max(early) < 1e-6 < 0.2 < min(late)


def test_digit_fault_names_the_number_slice(base, tok, suite):
    r = run(base, digits_scrambled(base, tok), tok, suite)
    assert r.verdict.slices["numbers-en"] == NOGO
    assert r.verdict.slices["names-zh"] == GO
    assert any(x.slice == "numbers-en" and x.measure == "focus_kl_mean" and x.level == NOGO
               for x in r.verdict.reasons)
    # the numbers slice's digits are where it hurts most
    assert r.slices["numbers-en"]["focus_kl_mean"] > 3 * r.slices["names-zh"].get("focus_kl_mean", 0)


def test_max_len_beyond_the_model_is_refused(base, tok, suite):
    from quantkit.errors import QuantkitError
    with pytest.raises(QuantkitError, match="--max-len: 8192 exceeds the model's max_position_embeddings"):
        evaluate(base, base, tok, suite=suite, max_len=8192, progress=False)
