"""Shared fixtures. Helpers live in model_factory.py (a unique module name: pytest puts this
folder on sys.path, so tests anywhere under tests/ can import it)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

# Without a GPU, Triton kernels run in the interpreter; it must be set before any @triton.jit
# runs, and transformers can import triton while tests are collected.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from model_factory import make_llama_dir


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_llama_dir(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from quantkit.models import default_model_dir

    return default_model_dir()
