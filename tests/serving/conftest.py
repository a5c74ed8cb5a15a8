"""Checkpoints the engine tests share (converted once a session)."""
from __future__ import annotations

import pytest

from engine_helpers import convert


@pytest.fixture(scope="session")
def fp8_checkpoint(tmp_path_factory):
    return convert("fp8-dynamic", tmp_path_factory.mktemp("engine") / "fp8-dynamic")
