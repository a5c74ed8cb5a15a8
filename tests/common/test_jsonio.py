"""Strict JSON: non-finite floats written as null, and named."""

from __future__ import annotations

import json
import math

import pytest

from quantkit.common.jsonio import dumps_strict, finite, nonfinite_fields, nonfinite_warning

DATA = {"modules": {"model.layers.0.q": {"sqnr_db": float("nan"), "bits": 8}},
        "rows": [1.5, float("inf"), (float("-inf"), "x")], "ok": 0.25}


def strict_loads(text: str):
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_dumps_strict_writes_null_for_every_non_finite_float():
    back = strict_loads(dumps_strict(DATA, indent=1))
    assert back == {"modules": {"model.layers.0.q": {"sqnr_db": None, "bits": 8}},
                    "rows": [1.5, None, [None, "x"]], "ok": 0.25}


def test_finite_leaves_finite_data_equal_and_the_input_untouched():
    clean = {"a": [1, 2.5, "s", None, True], "b": {"c": -0.0}}
    assert finite(clean) == clean
    finite(DATA)
    assert math.isnan(DATA["modules"]["model.layers.0.q"]["sqnr_db"])


def test_nonfinite_fields_are_named_by_path():
    assert nonfinite_fields(DATA) == ["modules.model.layers.0.q.sqnr_db", "rows.1", "rows.2.0"]
    assert nonfinite_fields({"a": 1.0}) == []
    assert nonfinite_fields(float("nan")) == ["(the value)"]


def test_nonfinite_warning_names_the_file_and_the_first_fields():
    assert nonfinite_warning({"a": 1.0}, "log.json") is None
    line = nonfinite_warning(DATA, "log.json", shown=2)
    assert line.startswith("log.json: modules.model.layers.0.q.sqnr_db, rows.1 and 1 more not a finite number")
    assert "\n" not in line
