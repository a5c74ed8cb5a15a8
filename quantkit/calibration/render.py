"""Turn a log record into the text the model would see.

Shapes, tried in this order (key names come from ``FieldMap``):
- chat: ``messages`` = [{"role", "content"}, ...] rendered with the model's own chat template;
- prompt/completion: ``prompt`` + ``completion`` concatenated as-is (a completion log);
- raw text: ``text``.
The "instruction" kept beside the text is what a user asked (system and user turns, or the
prompt); task rules read it rather than the whole rendered conversation. The "content" is the
row's words without any template (roles and turns kept apart): its hash identifies the row
whatever model renders it, so an evaluation can leave out the rows a calibration set holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from quantkit.calibration.config import FieldMap


@dataclass(frozen=True)
class Row:
    line: int
    text: str
    instruction: str
    shape: str             # "chat" | "prompt" | "text"
    task: str | None       # the log's task field as the user wrote it; None when absent
    content: str = ""      # the row's own words, template-free: its content hash (dedup.content_key)


class RowError(Exception):
    """A record that cannot be rendered; ``reason`` is the malformed-count key."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


ChatRenderer = Callable[[list[dict[str, str]]], str]


_PROBE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u 1"},
          {"role": "assistant", "content": "a"}, {"role": "user", "content": "u 2"}]


def chat_renderer(tokenizer: Any) -> ChatRenderer:
    """Render with the tokenizer's chat template; fall back to a plain role-tagged layout when the
    tokenizer has none (base models), so chat logs still calibrate a base model sensibly."""
    if not getattr(tokenizer, "chat_template", None):
        return lambda messages: "\n\n".join(f"{m['role']}: {m['content']}" for m in messages)
    slow = lambda messages: tokenizer.apply_chat_template(messages, tokenize=False)  # noqa: E731
    fast = _compiled_renderer(tokenizer)
    if fast is None:
        return slow
    try:
        if fast(_PROBE) == slow(_PROBE) and fast(_PROBE[1:2]) == slow(_PROBE[1:2]):
            return fast
    except Exception:
        pass
    return slow


def _compiled_renderer(tokenizer: Any) -> ChatRenderer | None:
    # apply_chat_template spends ~70% of its time converting and checking its inputs; our messages
    # are already plain {role, content} strings, so render the same compiled template directly.
    # transformers' compiler is private API: any failure, or any difference on the probe
    # conversation above, falls back to apply_chat_template.
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        template = _compile_jinja_template(tokenizer.chat_template)
        specials = dict(tokenizer.special_tokens_map)
    except Exception:
        return None
    return lambda messages: template.render(messages=messages, add_generation_prompt=False, **specials)


def render_record(line: int, record: dict[str, Any], fields: FieldMap, render_chat: ChatRenderer) -> Row:
    task = _task_value(record.get(fields.task)) if fields.task else None
    if fields.messages in record and record[fields.messages] is not None:
        messages = clean_messages(record[fields.messages])
        instruction = "\n".join(m["content"] for m in messages if m["role"] in ("system", "user"))
        try:
            text = render_chat(messages)
        except Exception:  # a template may reject a role order (e.g. two user turns in a row)
            raise RowError("template_rejected") from None
        content = "\x1e".join(f"{m['role']}\x1f{m['content']}" for m in messages)
        return Row(line, text, instruction or text, "chat", task, content)
    if fields.prompt in record and record[fields.prompt] is not None:
        prompt = _as_text(record[fields.prompt])
        completion = _as_text(record.get(fields.completion) or "")
        if not (prompt + completion).strip():
            raise RowError("empty_text")
        return Row(line, prompt + completion, prompt, "prompt", task, prompt + "\x1e" + completion)
    if fields.text in record and record[fields.text] is not None:
        text = _as_text(record[fields.text])
        if not text.strip():
            raise RowError("empty_text")
        return Row(line, text, text, "text", task, text)
    raise RowError("missing_field")


def _as_text(value: Any) -> str:
    if not isinstance(value, str):
        raise RowError("wrong_type")
    return value


def _task_value(value: Any) -> str | None:
    """The user's label as written (only surrounding space dropped): reports must show it."""
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    return value.strip() or None


def clean_messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise RowError("bad_messages")
    out = []
    for message in value:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RowError("bad_messages")
        content = message.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise RowError("bad_messages")
        out.append({"role": message["role"], "content": content})
    if not any(m["content"].strip() for m in out):
        raise RowError("empty_text")
    return out
