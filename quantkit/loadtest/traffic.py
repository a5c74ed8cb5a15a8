"""The user's traffic as a load test needs it: per row, the prompt a server is sent (the
conversation up to its first reply, through the model's chat template with the generation prompt:
the tokens the server sees) and the reply's length in tokens, its end-of-turn token included:
what the server generates before it stops).

Rows are read as ``quantkit calibrate`` and ``quantkit eval --calib`` read them (JSONL chat rows,
prompt/completion, CSV, Parquet, datasets folders; evaluation/business.py renders them). A row
that cannot be read is counted and left out, as the sampler does; a log with none readable, or
with no reply to fit output lengths on, is refused in one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantkit.calibration.io import read_log
from quantkit.calibration.render import RowError, render_record
from quantkit.errors import QuantkitError
from quantkit.evaluation.business import FIELDS, TemplateFailed, business_item, field_aliases


@dataclass
class Traffic:
    """Prompts and both directions' lengths; ``output_tokens`` only for rows with a reply."""
    prompts: list[str] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    rows: int = 0
    without_prompt: int = 0
    malformed: int = 0


def _tokens(tokenizer: Any, text: str) -> int:
    bos = getattr(tokenizer, "bos_token", None)
    return len(tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"])


def read_traffic(log: str | Path, tokenizer: Any) -> Traffic:
    """The prompts and lengths of every readable row of ``log``."""
    path = Path(log)
    if not path.exists():
        raise QuantkitError(f"--traffic: {path}: not found")
    raw = read_log(path)
    out = Traffic()
    for line, record in raw.records:
        record = field_aliases(record)
        try:
            row = render_record(line, record, FIELDS, lambda messages: "")
        except RowError as e:
            raw.malformed.add(e.reason, line)
            continue
        out.rows += 1
        try:
            item = business_item(row, record, tokenizer)
        except TemplateFailed:   # counted with the rows that cannot be read, as the sampler counts them
            raw.malformed.add("template_rejected", line)
            continue
        prompt = item.get("gen_prompt")
        if not prompt:
            out.without_prompt += 1
            continue
        out.prompts.append(prompt)
        out.prompt_tokens.append(_tokens(tokenizer, prompt))
        if item["reply"]:
            start, end = item["score"][0]
            out.output_tokens.append(len(tokenizer(item["text"][start:end], add_special_tokens=False)["input_ids"]))
    out.malformed = raw.malformed.total
    if not out.prompts:
        raise QuantkitError(f"--traffic: {path}: no usable row ({raw.malformed.summary() or 'empty'})")
    if len(out.output_tokens) < 2:
        raise QuantkitError(f"--traffic: {path}: {len(out.output_tokens)} row(s) with a reply: output lengths need "
                            "at least two (chat rows with an assistant turn, or prompt/completion rows)")
    return out
