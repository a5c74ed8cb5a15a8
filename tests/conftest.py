"""Shared fixtures. Helpers live in model_factory.py (a unique module name: pytest puts this
folder on sys.path, so tests anywhere under tests/ can import it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# The Triton environment (TRITON_INTERPRET without a GPU) is set by the repository's root
# conftest.py, which pytest loads before this one and before collecting quantkit/'s doctests.
from model_factory import make_llama_dir, save_byte_tokenizer


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_llama_dir(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from quantkit.inputs.embedded_model import default_model_dir

    return default_model_dir()


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A tiny Llama with a byte tokenizer, and a 24-row JSONL log of short numeric texts."""
    root = tmp_path_factory.mktemp("text")
    model = save_byte_tokenizer(make_llama_dir(root / "model", vocab=260))
    calib = root / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": f"Line {i}: the meter read {i * 31} kWh in week {i % 52}."}) + "\n"
                             for i in range(24)))
    return model, calib
