"""Shared fixtures. Helpers live in model_factory.py (a unique module name: pytest puts this
folder on sys.path, so tests anywhere under tests/ can import it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# QUANTKIT_TRITON_COMPILED=1 (benchmarks/gpu_check.sh on a GPU): compiled kernels or no run at
# all; never pass by falling back to the interpreter when torch sees no device.
if os.environ.get("QUANTKIT_TRITON_COMPILED") == "1" and (
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") != "0"):
    raise pytest.UsageError("QUANTKIT_TRITON_COMPILED=1: needs a CUDA device and TRITON_INTERPRET unset "
                            f"(cuda available: {torch.cuda.is_available()}, "
                            f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r})")

# Without a GPU, Triton kernels run in the interpreter; it must be set before any @triton.jit
# runs, and transformers can import triton while tests are collected. An explicit
# TRITON_INTERPRET is kept (setdefault): unset on a GPU machine, the kernels compile.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from model_factory import make_llama_dir


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    return make_llama_dir(tmp_path_factory.mktemp("tiny") / "llama")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from quantkit.models import default_model_dir

    return default_model_dir()
