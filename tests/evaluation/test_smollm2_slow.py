"""The default thresholds on the real model (SmolLM2-135M): an 8-bit per-channel copy is
GO, one layer scaled 4x is NO-GO. The full suite on real checkpoints is benchmarks/eval.py."""
import pytest
from tiny import fake_quant_linears, scaled_layer

from quantkit.evaluation import SuiteOptions, evaluate
from quantkit.evaluation.verdict import GO, NOGO

pytestmark = pytest.mark.slow

# generation agreement over 3 prompts is too noisy for a test; benchmarks/eval.py measures it
OPTS = SuiteOptions(text_items=3, extract_items=0, code_items=0, mc_items=8, gen_prompts=0, item_tokens=128)


@pytest.fixture(scope="module")
def smol():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quantkit.inputs.embedded_model import default_model_dir
    d = default_model_dir()
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(d)


@pytest.fixture(autouse=True)
def two_threads():
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(2)  # the real model does use both cores
    yield
    torch.set_num_threads(n)


def test_the_default_model_gates_on_english(smol):
    from quantkit.evaluation.languages import LanguageGate, language_gate, model_folder
    assert language_gate(None, model_folder(smol[0])) == LanguageGate(("en",), "model card")


def test_default_thresholds_on_smollm2(smol):
    model, tok = smol
    suite = "numbers-zh,code-en,knowledge-en,long-en"
    # SmolLM2's model card says English; the thresholds are checked on Chinese text too
    good = evaluate(model, fake_quant_linears(model, 8), tok, suite=suite, max_len=1024, options=OPTS,
                    progress=False, languages="en,zh")
    assert good.decision == GO, [r.text() for r in good.verdict.reasons]
    assert all(v["kl_mean"] < 0.01 for k, v in good.slices.items() if "kl_mean" in v)
    bad = evaluate(model, scaled_layer(model, 10, 4.0), tok, suite=suite, max_len=1024, options=OPTS,
                   progress=False, languages="en,zh")
    assert bad.decision == NOGO
    assert {r.slice for r in bad.verdict.reasons if r.level == NOGO} >= {"numbers-zh", "code-en", "long-en"}
