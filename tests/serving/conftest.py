"""Checkpoints the engine tests share (converted once a session)."""
from __future__ import annotations

import pytest

from engine_helpers import convert


@pytest.fixture(scope="session")
def w8a8_checkpoint(tmp_path_factory):
    # W8A8: vLLM's CPU build runs its int8 kernel fast, FP8 weights slowly (FP8 is measured in benchmarks/engine_eval.py)
    return convert("w8a8", tmp_path_factory.mktemp("engine") / "w8a8")
