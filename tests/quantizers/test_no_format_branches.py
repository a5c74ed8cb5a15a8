"""Quantizers get every number format from the format axis (``numerics/number_formats``): no
module under ``quantizers/``, ``steps/`` or ``transforms/awq.py`` names an FP4 kind, so a new
format is one file there and a new quantizer covers it without a branch."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "quantkit"
WORDS = re.compile(r"fp4_kind|nvfp4|mxfp4", re.IGNORECASE)


def modules() -> list[Path]:
    return sorted([*PACKAGE.joinpath("quantizers").rglob("*.py"), *PACKAGE.joinpath("steps").rglob("*.py"),
                   PACKAGE / "transforms" / "awq.py"])


def test_no_quantizer_names_a_format_kind():
    found = [f"{p.relative_to(PACKAGE)}:{i}: {line.strip()}" for p in modules()
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if WORDS.search(line)]
    assert not found, "format kinds named outside the format axis:\n" + "\n".join(found)


def test_the_check_sees_the_quantizers():
    names = {p.name for p in modules()}
    assert {"rtn.py", "stack.py", "base.py", "awq.py"} <= names
