import pytest

from quantkit.calibration.config import FieldMap
from quantkit.calibration.render import RowError, chat_renderer, render_record


@pytest.fixture(scope="module")
def render(tokenizer):
    chat = chat_renderer(tokenizer)
    return lambda record, fields=FieldMap(): render_record(3, record, fields, chat)


def test_chat_rows_use_the_model_template(render, tokenizer):
    msgs = [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "Hi"}]
    row = render({"messages": msgs, "task": "Chit Chat"})
    assert row.text == tokenizer.apply_chat_template(msgs, tokenize=False)
    assert row.text.startswith("<|im_start|>system") and "<|im_start|>user\n你好<|im_end|>" in row.text
    assert row.instruction == "你好" and row.shape == "chat" and row.task == "Chit Chat"


def test_content_parts_and_field_mapping(render):
    row = render({"conv": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
                 FieldMap(messages="conv"))
    assert "ab" in row.text


def test_prompt_completion_and_text(render):
    row = render({"prompt": "Q: 2+2?", "completion": " 4"})
    assert (row.text, row.instruction, row.shape, row.task) == ("Q: 2+2? 4", "Q: 2+2?", "prompt", None)
    assert render({"body": "raw"}, FieldMap(text="body")).text == "raw"


@pytest.mark.parametrize("record, reason", [
    ({"other": 1}, "missing_field"),
    ({"text": "  \n"}, "empty_text"),
    ({"messages": []}, "bad_messages"),
    ({"messages": [{"content": "no role"}]}, "bad_messages"),
    ({"messages": [{"role": "user", "content": ""}]}, "empty_text"),
    ({"prompt": ["not", "text"]}, "wrong_type"),
])
def test_bad_records_name_their_reason(render, record, reason):
    with pytest.raises(RowError) as err:
        render(record)
    assert err.value.reason == reason
