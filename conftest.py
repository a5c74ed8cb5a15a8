"""Loaded by pytest before anything is collected, under tests/ and quantkit/ alike (the doctests
of quantkit/ import every module of the package, kernels included, so the Triton environment
must be set here and not in tests/conftest.py, which applies to tests/ only)."""

from __future__ import annotations

import os

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


def pytest_ignore_collect(collection_path, config):
    """conftest.py files hold fixtures, not doctests: collected as doctest modules (addopts has
    --doctest-modules), the several files named ``conftest`` clash by module name. pytest still
    loads them as conftests."""
    if collection_path.name == "conftest.py":
        return True
    return None
