"""A worst example's text is cut at character boundaries: a byte-level tokenizer splits a Chinese
character over tokens, and a window decoded from inside one used to end in U+FFFD ('四年多来，他�')."""
from tiny import FAST, TINY_THRESHOLDS, _take, fake_quant_linears, tiny_tokenizer

from quantkit.evaluation import evaluate, load_suite
from quantkit.evaluation.task_metrics import extraction_result
from quantkit.evaluation.text_window import REPLACEMENT, context, token_text

TEXT = "四年多来，他一直在这家工厂工作，月薪 4,250 元。"


def test_every_window_of_chinese_text_is_whole_characters():
    tok = tiny_tokenizer()
    ids = tok(TEXT)["input_ids"]
    assert any(REPLACEMENT in tok.decode(ids[:n]) for n in range(len(ids)))   # the tokenizer splits characters
    for end in range(1, len(ids)):
        for start in range(0, end, 3):
            text = context(tok.decode, ids, start, end)
            assert REPLACEMENT not in text and text in TEXT, (start, end, text)
        shown = token_text(tok.decode, ids, end)
        assert shown and REPLACEMENT not in shown and shown in TEXT, (end, shown)


def test_the_worst_examples_of_a_chinese_slice_end_on_a_character(base, tok):
    suite = [_take(s, 3) for s in load_suite("numbers-zh")]
    cand = fake_quant_linears(base, 4, group=32)
    r = evaluate(base, cand, tok, suite=suite, max_len=256, thresholds=TINY_THRESHOLDS, options=FAST,
                 progress=False, show_samples=True)
    examples = [ex for exs in r.examples.values() for ex in exs]
    texts = [ex[k] for ex in examples for k in ("context", "token", "prompt", "baseline", "candidate") if k in ex]
    assert len(texts) >= 2 and any(any("\u4e00" <= c <= "\u9fff" for c in t) for t in texts)
    assert [t for t in texts if t.startswith(REPLACEMENT) or t.endswith(REPLACEMENT)] == []


def test_an_extraction_reply_cut_after_n_tokens_is_whole_characters():
    tok = tiny_tokenizer()
    ids = tok(TEXT)["input_ids"]
    for n in range(1, len(ids)):
        out = extraction_result(tok, {"id": "x", "reference": ["4250"]}, ids[:n])["output"]
        assert REPLACEMENT not in out and TEXT.startswith(out), (n, out)
