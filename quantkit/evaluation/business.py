"""Business slices: the user's own traffic log as private slices, one per task, scored the way
the server sees the traffic.

Rows are read as the sampler reads them (calibration/io.py and render.py: JSONL, CSV, Parquet,
text, a HF datasets folder; ``messages``, ``prompt`` + ``completion`` or ``response``, ``text``)
and carry the sampler's task labels (the user's own, else the rules'), so a slice is a task of
the calibration's coverage report. What a row scores:

- a chat row is rendered with the model's chat template and only its assistant turns are
  scored, each as the template writes it (the reply and the token that closes the turn); the
  rest is the context they are predicted from. A chat row with no assistant content (a log of
  requests alone) scores its turns' contents instead; the report counts those rows;
- a prompt/completion row scores the completion; a text row all of its text.

A row longer than ``tokens`` keeps the window that ends at its last scored token (forced.py).
A task whose replies are labels from a small set (label_tasks.py) is marked on its slice, for the
label measures. Rows whose content hash is in the calibration sample (its ``manifest.json``'s
``sample_content``) are left out and counted, and so are repeats of a row already taken: a slice
measures text the candidate was not calibrated on, each text once.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.calibration.config import FieldMap
from quantkit.calibration.dedup import content_key
from quantkit.calibration.io import file_sha256, read_log
from quantkit.calibration.render import RowError, clean_messages, render_record
from quantkit.calibration.task_types import infer_task, user_labels
from quantkit.errors import QuantkitError
from quantkit.config.validation import json_object
from quantkit.evaluation.label_tasks import label_set
from quantkit.evaluation.slices import Slice

FIELDS = FieldMap()
COUNTS = ("rows", "in_calibration", "repeats", "evaluated", "without_reply")
# why a slice holds the rows it holds (business_meta)
STOP_BUDGET, STOP_ROW_CAP, STOP_EXHAUSTED = "token budget met", "row cap hit", "log exhausted"


@dataclass
class BusinessRows:
    slices: list[Slice]
    summary: dict = field(default_factory=dict)   # per task COUNTS, the calibration check


def sample_hashes(sample: str | Path) -> tuple[set[str], dict]:
    """The content hashes a calibration sample holds: a sampler folder or its manifest.json, or
    a converted checkpoint (or its quantization_log.json) whose calibration was drawn from a log."""
    path = Path(sample)
    if path.is_dir():
        path = path / ("quantization_log.json" if (path / "quantization_log.json").exists() else "manifest.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise QuantkitError(f"--calib-sample: {path}: not a readable calibration manifest "
                            f"({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise QuantkitError(f"--calib-sample: {path}: not a calibration manifest (no JSON object)")
    checkpoint = isinstance(data.get("calibration"), dict) and "quantkit_version" in data
    if checkpoint:
        data = data["calibration"]   # a checkpoint's log: the set it was converted with
    held = (data.get("sample_content") or {}).get("selected")
    if not isinstance(held, list):
        why = ("the checkpoint's calibration was not drawn from a log by this quantkit" if checkpoint else
               "a manifest older than version 2: draw the set again with quantkit calibrate")
        raise QuantkitError(f"--calib-sample: {path}: no sample_content hashes ({why})")
    return set(held), {"manifest": str(path), "source_sha256": (data.get("source") or {}).get("sha256")}


def read_business(log: str | Path, tokenizer: Any = None, rows_per_task: int = 256,
                  calibration_sample: str | Path | None = None) -> BusinessRows:
    """One private slice per task of ``log``: its first ``rows_per_task`` rows that are not in
    ``calibration_sample`` and not repeats, rendered with ``tokenizer``'s chat template; a task
    whose replies are labels (label_tasks.py, judged on all its rows; not without a tokenizer) carries
    its label set."""
    path = Path(log)
    if not path.exists():
        raise QuantkitError(f"{path}: calibration log not found")
    held, check = sample_hashes(calibration_sample) if calibration_sample is not None else (None, {})
    raw = read_log(path)
    _refuse_malformed(path, raw)
    rows = []
    for line, record in raw.records:
        record = field_aliases(record)
        try:  # the scan needs no template: content, task and instruction only
            rows.append((render_record(line, record, FIELDS, lambda messages: ""), record))
        except RowError as e:
            raw.malformed.add(e.reason, line)
    if not rows:
        raise QuantkitError(f"{path}: no usable business rows ({raw.malformed.summary() or 'empty'})")
    labels = user_labels([r.task for r, _ in rows],
                         [None if r.task is not None else infer_task(r.instruction, r.shape) for r, _ in rows])
    counts: dict[str, Counter] = {}
    items: dict[str, list[dict]] = {}
    replies: dict[str, list[str | None]] = {}
    seen: set[str] = set()
    for (row, record), task in zip(rows, labels):
        replies.setdefault(task, []).append(first_reply(row.shape, record))
        n = counts.setdefault(task, Counter())
        n["rows"] += 1
        key = content_key(row.content)
        if held is not None and key in held:
            n["in_calibration"] += 1
            continue
        if key in seen:
            n["repeats"] += 1
            continue
        seen.add(key)
        if n["evaluated"] < rows_per_task:
            try:
                item = business_item(row, record, tokenizer)
            except TemplateFailed as e:
                raise QuantkitError(f"--calib: {path}: {e}") from None
            n["evaluated"] += 1
            n["without_reply"] += not item["reply"]
            items.setdefault(task, []).append(item)
    sets = {t: _label_set(rs, tokenizer) for t, rs in replies.items()}
    slices = [Slice(f"business:{t}", its, public=False, source=str(path), label_replies=sets[t])
              for t, its in sorted(items.items())]
    if not slices:
        raise QuantkitError(f"{path}: every row is in the calibration sample ({calibration_sample}): "
                            "nothing is left to evaluate")
    if check:
        check["same_source"] = check.pop("source_sha256") == _sha256(path)
    summary = {"log": str(path), "rows_per_task": rows_per_task, "malformed": raw.malformed.total,
               "checked_against": check or None,
               "tasks": {t: {**{k: counts[t][k] for k in COUNTS}, "labels": len(sets[t])} for t in sorted(counts)}}
    return BusinessRows(slices, summary)


def first_reply(shape: str, record: dict) -> str | None:
    """A row's first reply as the log holds it: its first assistant turn's content, its completion."""
    if shape == "chat":
        return next((m["content"] for m in clean_messages(record[FIELDS.messages]) if m["role"] == "assistant"), None)
    return record.get(FIELDS.completion) if shape == "prompt" else None


def _label_set(replies: list[str | None], tokenizer: Any) -> tuple[str, ...]:
    if tokenizer is None:   # the flags' check before the models load: no slice is scored
        return ()
    return label_set(replies, lambda r: len(tokenizer(r, add_special_tokens=False)["input_ids"]))


def _refuse_malformed(path: Path, raw) -> None:
    """One line naming the first unreadable row. The sampler counts and skips such rows (a big log
    has a few); the evaluation refuses them, as ``--calib`` always has: its rows are the evidence a
    verdict rests on, and a row dropped without the user's knowing changes a slice."""
    if not raw.malformed.total:
        return
    reason, line = min(((r, ls[0]) for r, ls in raw.malformed.first_lines.items()), key=lambda x: x[1])
    lines = path.read_bytes().splitlines() if path.is_file() else []
    if reason in ("bad_json", "not_an_object") and line <= len(lines):
        try:
            text = lines[line - 1].decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None:
            json_object(text, f"{path}:{line}")      # raises, saying what the line holds
    raise QuantkitError(f"{path}:{line}: unreadable row ({reason.replace('_', ' ')}); "
                        f"{raw.malformed.total} such row(s) in all")


def business_slices(log: str | Path, tokenizer: Any = None, rows_per_task: int = 256,
                    calibration_sample: str | Path | None = None) -> list[Slice]:
    """``read_business(...).slices``."""
    return read_business(log, tokenizer, rows_per_task, calibration_sample).slices


def business_meta(summary: dict, values: dict[str, dict], scored_tokens: int) -> dict:
    """The report's record of the business rows: the summary with each task's scored tokens, why
    its rows stop there (``STOP_*``) and whether they are enough evidence (``scored_tokens``)."""
    out = {**summary, "scored_tokens_min": scored_tokens,
           "tasks": {t: dict(c) for t, c in summary["tasks"].items()}}
    for task, c in out["tasks"].items():
        got = values.get(f"business:{task}") or {}
        c["candidates"] = c.pop("evaluated")      # rows read for the slice; the scored-token budget took:
        c["evaluated"] = got.get("rows", 0)
        c["without_reply"] = got.get("rows_without_reply", 0)
        c["scored_tokens"] = got.get("tokens", 0)
        c["stop"] = stop_reason(c, summary["rows_per_task"], scored_tokens)
        c["evidence"] = "sufficient" if c["scored_tokens"] >= scored_tokens else "insufficient"
        if "label_rows" in got:
            c["label_rows"] = got["label_rows"]
    return out


def stop_reason(counts: dict, row_cap: int, scored_tokens: int) -> str:
    """Why a task's slice holds the rows it holds: the budget met, the row cap, or no row left.

    >>> stop_reason({"rows": 900, "in_calibration": 0, "repeats": 0, "candidates": 256, "scored_tokens": 700}, 256, 1024)
    'row cap hit'
    """
    if counts["scored_tokens"] >= scored_tokens:
        return STOP_BUDGET
    left = counts["rows"] - counts["in_calibration"] - counts["repeats"]
    return STOP_ROW_CAP if counts["candidates"] >= row_cap and left > counts["candidates"] else STOP_EXHAUSTED


def _sha256(path: Path) -> str:
    return file_sha256(path)


def field_aliases(record: dict) -> dict:
    """The evaluation's older field names: ``response`` for ``completion``, ``task_type`` for ``task``."""
    out = dict(record)
    if "completion" not in out and "response" in out:
        out["completion"] = out.pop("response")
    if out.get("task") is None and out.get("task_type") is not None:
        out["task"] = out["task_type"]
    return out


class TemplateFailed(QuantkitError):
    """The tokenizer's chat template raised on a row."""


def business_item(row, record: dict, tokenizer: Any) -> dict:
    """A text item: the rendered row, the character spans scored, and the generation prompt."""
    item = {"id": f"row-{row.line}", "kind": "text"}
    if row.shape == "chat":
        try:
            text, spans, reply, prompt = render_turns(tokenizer, clean_messages(record[FIELDS.messages]))
        except Exception as e:   # the model's own template code: whatever it raises, one line naming the row
            raise TemplateFailed(f"line {row.line}: the model's chat template fails on this conversation "
                                 f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    elif row.shape == "prompt":
        prompt = record[FIELDS.prompt]
        text = prompt + (record.get(FIELDS.completion) or "")
        reply = bool(text[len(prompt):].strip())
        spans = [(len(prompt), len(text))] if reply else [(0, len(text))]
    else:
        text, spans, reply, prompt = row.content, [(0, len(row.content))], False, None
    item.update(text=text, score=[list(s) for s in spans], reply=reply)
    if prompt:
        item["gen_prompt"] = prompt
    return item


def render_turns(tokenizer: Any, messages: list[dict]) -> tuple[str, list[tuple[int, int]], bool, str | None]:
    """The conversation as the server renders it, the character spans of its assistant turns
    (of every turn's content when none has content), whether it had a reply, and the prompt a
    reply is generated from (everything before the first one; without one, the whole
    conversation with the template's generation prompt)."""
    if not getattr(tokenizer, "chat_template", None):
        return _plain_turns(messages)

    def render(msgs: list[dict], open_reply: bool = False) -> str:
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=open_reply)

    text = render(messages)
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or not m["content"].strip():
            continue
        span = _turn_span(render, messages, i, text)
        if span is None:  # a template that rewrites earlier turns: the reply's own words
            at = text.find(m["content"].strip(), spans[-1][1] if spans else 0)
            span = (at, at + len(m["content"].strip())) if at >= 0 else None
        if span is not None:
            spans.append(_rstrip(text, span))
    if spans:
        return text, spans, True, text[:spans[0][0]]
    try:
        prompt = render(messages, open_reply=True) if messages[-1]["role"] != "assistant" else None
    except Exception:  # a template that refuses an open reply here
        prompt = None
    return text, _content_spans(text, messages), False, prompt


def _turn_span(render, messages: list[dict], i: int, text: str) -> tuple[int, int] | None:
    try:
        before = render(messages[:i], open_reply=True) if i else ""
        upto = render(messages[:i + 1])
    except Exception:
        return None
    if i and text.startswith(upto) and upto.startswith(before) and len(upto) > len(before):
        return len(before), len(upto)
    return None


def _rstrip(text: str, span: tuple[int, int]) -> tuple[int, int]:
    # the line break after a turn's end token is layout: the server stops at the token
    a, b = span
    while b > a and text[b - 1].isspace():
        b -= 1
    return a, b


def _content_spans(text: str, messages: list[dict]) -> list[tuple[int, int]]:
    spans, at = [], 0
    for m in messages:
        c = m["content"].strip()
        j = text.find(c, at) if c else -1
        if j >= 0:
            spans.append((j, j + len(c)))
            at = j + len(c)
    return spans or [(0, len(text))]


def _plain_turns(messages: list[dict]) -> tuple[str, list[tuple[int, int]], bool, str | None]:
    """The sampler's layout for a tokenizer without a chat template (render.chat_renderer)."""
    parts, spans, at = [], [], 0
    for m in messages:
        head = f"{m['role']}: "
        if m["role"] == "assistant" and m["content"].strip():
            spans.append((at + len(head), at + len(head) + len(m["content"])))
        parts.append(head + m["content"])
        at += len(parts[-1]) + 2
    text = "\n\n".join(parts)
    if spans:
        return text, spans, True, text[:spans[0][0]]
    return text, _content_spans(text, messages), False, text + "\n\nassistant: "
