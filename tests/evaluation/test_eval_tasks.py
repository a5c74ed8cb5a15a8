from tiny import FAST
from tiny import fake_quant_linears

from quantkit.evaluation.causal_lm import greedy, pad_id
from quantkit.evaluation.slices import load_suite
from quantkit.evaluation.task_metrics import extraction, f1, mc_summary, multiple_choice, normalise_numbers


def test_f1_and_number_normalisation():
    assert f1(["1", "2"], ["2", "3"]) == 0.5
    assert f1([], []) == 1.0 and f1(["1"], []) == 0.0
    assert f1(["5", "5"], ["5"]) == 2 * 0.5 * 1 / 1.5
    assert normalise_numbers("２００米，用时２分１０秒８８") == ["200", "2", "10", "88"]
    assert normalise_numbers("$1,200.50 or 3,5") == ["1200.50", "3,5"]


def test_multiple_choice_against_itself_and_by_hand(base, tok):
    items = load_suite("knowledge-en")[0].items[:6]
    p = multiple_choice(base, tok, items, pad_id(tok), batch=4)
    q = multiple_choice(base, tok, items, pad_id(tok), batch=1)  # batching must not change answers
    assert p == q and all(0 <= x < 4 for x in p)
    s = mc_summary(items, p, [(x + 1) % 4 for x in p])
    assert s["mc_agreement"] == 0.0
    gold = sum(a == it["answer"] for a, it in zip(p, items)) / len(items)
    assert s["mc_accuracy_base"] == gold


def test_greedy_batch_matches_single_prompts(base, tok):
    prompts = [tok("The national executive")["input_ids"], tok("123 + 456 =")["input_ids"]]
    both = greedy(base, prompts, 6, pad_id(tok), tok.eos_token_id)
    one = [greedy(base, [p], 6, pad_id(tok), tok.eos_token_id)[0] for p in prompts]
    assert both == one


def test_extraction_scores_identical_models_identically(base, tok):
    items = [it for it in load_suite("numbers-en")[0].items if it["kind"] == "extract"][:3]
    a = extraction(base, tok, items, FAST.extract_tokens, pad_id(tok), tok.eos_token_id, 3)
    b = extraction(fake_quant_linears(base, 8), tok, items, FAST.extract_tokens, pad_id(tok), tok.eos_token_id, 3)
    assert [x["f1"] for x in a] == [f1(normalise_numbers(x["output"]),
                                       [n for r in it["reference"] for n in normalise_numbers(r)])
                                    for x, it in zip(a, items)]
    assert len(b) == 3
