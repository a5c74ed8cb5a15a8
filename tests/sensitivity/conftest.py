"""Fixtures the mixed-precision tests share."""

from __future__ import annotations

import json

import pytest

from model_factory import make_llama_dir, save_byte_tokenizer


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A tiny Llama with a byte tokenizer, and a 24-row JSONL log of short numeric texts."""
    root = tmp_path_factory.mktemp("text")
    model = save_byte_tokenizer(make_llama_dir(root / "model", vocab=260))
    calib = root / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"Line {i}: the meter read {i * 31} kWh in week {i % 52}."}) + "\n"
                             for i in range(24)))
    return model, calib
