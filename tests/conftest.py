"""Shared fixtures. Helpers live in model_factory.py (a unique module name: pytest puts this
folder on sys.path, so tests anywhere under tests/ can import it)."""

from __future__ import annotations

from pathlib import Path

import pytest

# The Triton environment (TRITON_INTERPRET without a GPU) is set by the repository's root
# conftest.py, which pytest loads before this one and before collecting quantkit/'s doctests.
from model_factory import make_llama_dir


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_llama_dir(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from quantkit.inputs.models import default_model_dir

    return default_model_dir()
