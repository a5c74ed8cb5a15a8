"""The traffic a load test is shaped on: prompt lengths as the server sees them (the chat
template with the generation prompt), output lengths from the replies."""
from __future__ import annotations

import json
import re

import pytest

from quantkit.calibration.calibration_set import default_log_path
from quantkit.errors import QuantkitError
from quantkit.loadtest.lengths import fit_lognormal, length_summary
from quantkit.loadtest.traffic import read_traffic


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


def _log(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n")
    return path


def test_lengths_are_the_tokens_the_server_sees(tokenizer, tmp_path):
    chat = {"messages": [{"role": "user", "content": "How many legs has a spider?"},
                         {"role": "assistant", "content": "Eight legs."}]}
    plain = {"prompt": "Translate: chat", "completion": " cat"}
    t = read_traffic(_log(tmp_path / "log.jsonl", [chat, plain, chat]), tokenizer)
    assert (t.rows, t.malformed) == (3, 1)
    expected = tokenizer.apply_chat_template(chat["messages"][:1], tokenize=True, add_generation_prompt=True)
    if not isinstance(expected, list):
        expected = expected["input_ids"]
    assert t.prompts[0].endswith("<|im_start|>assistant\n") and t.prompt_tokens[0] == len(expected)
    # the reply and the end of its turn: what the server generates before it stops
    assert t.output_tokens[0] == len(tokenizer("Eight legs.<|im_end|>", add_special_tokens=False)["input_ids"]) == 4
    assert t.prompts[1] == "Translate: chat" and t.output_tokens[1] == len(tokenizer(" cat", add_special_tokens=False)["input_ids"])


def test_the_bundled_log_fits_within_10_percent_at_p50(tokenizer):
    t = read_traffic(default_log_path(), tokenizer)
    assert len(t.prompts) > 100 and len(t.output_tokens) > 100
    for lengths in (t.prompt_tokens, t.output_tokens):
        s = length_summary(lengths, fit_lognormal(lengths))
        assert s["p50"]["error"] == pytest.approx(0.0, abs=1e-9) and s["p99"]["empirical"] > s["p50"]["empirical"]


@pytest.mark.parametrize("rows, message", [
    ([], "no usable row (bad_json 1"),
    ([{"messages": [{"role": "user", "content": "hi"}]}] * 3, "0 row(s) with a reply"),
])
def test_a_log_that_cannot_shape_a_load_is_refused(rows, message, tokenizer, tmp_path):
    with pytest.raises(QuantkitError, match=r"--traffic: .*" + re.escape(message)):
        read_traffic(_log(tmp_path / "log.jsonl", rows), tokenizer)
    with pytest.raises(QuantkitError, match="--traffic: .*nope.jsonl: not found"):
        read_traffic(tmp_path / "nope.jsonl", tokenizer)
