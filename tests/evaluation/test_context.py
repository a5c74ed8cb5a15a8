"""The long-context slices run to the deployment length (the model's own by default); a text
shorter than it, a text cut at it, and a window the machine cannot afford are said in the report."""
import pytest
from tiny import FAST, TINY_THRESHOLDS, _take, tiny_model

from quantkit.evaluation import context, evaluate, load_suite
from quantkit.evaluation.report import markdown
from quantkit.evaluation.slices import Slice


@pytest.fixture(scope="module")
def long_en():
    return [_take(s, 1) for s in load_suite("long-en")]


def run(base, tok, suite, **kw):
    return evaluate(base, base, tok, suite=suite, thresholds=TINY_THRESHOLDS, options=FAST, progress=False, **kw)


def test_default_length_is_the_models_and_cut_texts_are_named(tok, long_en):
    model = tiny_model(len(tok), max_pos=1024)
    r = run(model, tok, long_en)
    assert r.meta["max_len"] == 1024 and r.meta["max_len_source"] == "the model's max_position_embeddings"
    assert r.buckets["long-en"][-1]["end"] == 1024 and r.buckets["long-en"][-1]["tokens"] == 512
    s = r.meta["long_context"]["slices"]["long-en"]
    full = len(tok(long_en[0].items[0]["text"])["input_ids"])
    assert s["deepest"] == 1023 and s["cut"] == 1 and s["tokens_left_out"] == full - 1024
    assert not r.warnings   # a text longer than the deployment length is no gap, only a note
    assert any(f"cut at 1024 tokens ({full - 1024} tokens left out)" in n for n in r.meta["long_context_notes"])
    assert f"({full - 1024} tokens left out)" in markdown(r.to_json())


def test_texts_shorter_than_the_deployment_length_leave_a_warning(base, tok):
    ids_text = "The national executive appointed a senator as interim leader. " * 30
    short = Slice("long-en", [{"id": "t", "kind": "text", "text": ids_text}], long_context=True)
    r = run(base, tok, [short], max_len=2048, max_len_source="--max-len")
    n = len(tok(ids_text)["input_ids"])
    assert n < 2048
    assert r.meta["long_context"]["slices"]["long-en"]["deepest"] == n - 1
    (w,) = r.warnings
    assert w.startswith(f"long-en: its longest text holds {n} tokens: positions {n}-2048 of the deployment "
                        "length 2048 (--max-len) are not measured")
    # the deepest bucket that holds tokens is the one gated, and it is named
    assert r.slices["long-en"]["last_bucket_end"] == 1 << (n - 1).bit_length()


def test_a_window_the_machine_cannot_afford_is_shortened_and_said(base, tok, long_en, monkeypatch):
    need = context.window_bytes(base.config, 2048)
    monkeypatch.setattr(context, "free_bytes", lambda: int(need / context.MEMORY_SHARE) - 1)
    r = run(base, tok, long_en, max_len=2048)
    assert r.meta["long_context"]["window"] == 1024 and r.meta["max_len"] == 2048
    assert r.buckets["long-en"][-1]["end"] == 1024
    assert any(w.startswith("Long slices ran windows of 1024 tokens, not the deployment length 2048") for w in r.warnings)


def test_window_estimate_grows_with_the_square_for_eager_attention():
    from transformers import LlamaConfig
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4)
    lin = context.window_bytes(cfg, 4096, "sdpa")
    assert context.window_bytes(cfg, 8192, "sdpa") == 2 * lin
    assert context.window_bytes(cfg, 8192, "eager") - 2 * lin == 4 * (context.window_bytes(cfg, 4096, "eager") - lin)
