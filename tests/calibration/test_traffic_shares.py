"""Allocation by traffic: repeats count towards a task's share, yet no text is drawn twice."""

from __future__ import annotations

import json
import typing
from collections import Counter

import pytest

from quantkit.calibration import SamplerConfig, calibrate
from quantkit.calibration.allocate import POLICIES, allocate
from quantkit.calibration.dedup import exact_key
from quantkit.errors import QuantkitError


def _write(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _log(path, units, distinct_a: int, copies_a: int, distinct_b: int):
    """Task "faq": ``distinct_a`` texts each sent ``copies_a`` times (re-sent with other case and
    spacing: the same text to the de-duplicator); task "chat": ``distinct_b`` texts sent once."""
    rows = []
    for k in range(copies_a):
        for i in range(distinct_a):
            text = f"Question {i}: {units[i]}"
            rows.append({"text": text.upper() + "  " if k % 2 else text, "task": "faq"})
    rows += [{"text": f"Note {i}: {units[200 + i]}", "task": "chat"} for i in range(distinct_b)]
    return _write(path, rows)


def _sample_keys(res) -> list[bytes]:
    return [exact_key(s["text"]) for s in res.samples]


@pytest.fixture(scope="module")
def units(real_units):
    en = [u for u in real_units["en"] if 20 <= len(u) <= 120]
    assert len(en) >= 600
    return en


def test_repeats_count_towards_traffic_share_but_never_yield_the_same_text_twice(tmp_path, units, tokenizer):
    # faq: 100 distinct texts x 4 = 400 requests (20% of distinct rows, 50% of traffic)
    log = _log(tmp_path / "log.jsonl", units, 100, 4, 400)
    cfg = SamplerConfig(num_samples=100, max_len=128, length_edges=(128,), seed=3)
    res = calibrate(log, tokenizer, cfg)
    tasks = {t["name"]: t for t in res.manifest["tasks"]}
    assert (tasks["faq"]["traffic_rows"], tasks["faq"]["distinct_rows"]) == (400, 100)
    assert (tasks["chat"]["traffic_rows"], tasks["chat"]["distinct_rows"]) == (400, 400)
    assert tasks["faq"]["traffic_share"] == 0.5 and tasks["faq"]["distinct_share"] == 0.2
    picked = Counter(s["task"] for s in res.samples)
    assert picked == {"faq": 50, "chat": 50}, picked      # the traffic share, not the distinct one (20)
    keys = _sample_keys(res)
    assert len(set(keys)) == len(keys) == 100
    assert res.manifest["counts"]["duplicates_exact"] == 300


def test_a_task_out_of_distinct_texts_gives_its_remainder_to_the_others(tmp_path, units, tokenizer):
    # faq: 10 distinct texts x 40 = 400 requests, half the traffic: it can give 10 samples, no more
    log = _log(tmp_path / "log.jsonl", units, 10, 40, 400)
    cfg = SamplerConfig(num_samples=100, max_len=128, length_edges=(128,), seed=0)
    res = calibrate(log, tokenizer, cfg)
    picked = Counter(s["task"] for s in res.samples)
    assert picked == {"faq": 10, "chat": 90}, picked
    keys = _sample_keys(res)
    assert len(set(keys)) == len(keys)
    assert any("faq" in w and "all 10 distinct rows drawn" in w for w in res.manifest["warnings"])


@pytest.mark.parametrize("policy, expected", [("traffic", {"faq": 50, "chat": 50}),
                                              ("sqrt", {"faq": 50, "chat": 50}),
                                              ("balanced", {"faq": 50, "chat": 50})])
def test_policies_weigh_traffic_not_distinct_rows(tmp_path, units, tokenizer, policy, expected):
    # equal traffic, distinct rows 1:4: every policy splits evenly (the old distinct-row share gave 20:80)
    log = _log(tmp_path / "log.jsonl", units, 100, 4, 400)
    cfg = SamplerConfig(num_samples=100, max_len=128, length_edges=(128,), seed=1, policy=policy)
    assert Counter(s["task"] for s in calibrate(log, tokenizer, cfg).samples) == expected


def test_policy_weights_with_floors():
    traffic, distinct = {"a": 3600, "b": 400, "c": 4}, {"a": 900, "b": 100, "c": 4}
    assert allocate(traffic, 100, "traffic", 2, distinct) == {"a": 88, "b": 10, "c": 2}
    # sqrt: weights 60, 20, 2, lam = 100 / 82: 73.2, 24.4, 2.4; the last unit to the largest remainder
    assert allocate(traffic, 100, "sqrt", 2, distinct) == {"a": 73, "b": 24, "c": 3}
    assert allocate(traffic, 100, "balanced", 2, distinct) == {"a": 48, "b": 48, "c": 4}
    # a cell's floor is a floor under every policy, capped by what it holds
    for policy in POLICIES:
        got = allocate({"a": 10_000, "b": 1, "c": 3}, 20, policy, 3, {"a": 5_000, "b": 1, "c": 3})
        assert got["b"] == 1 and got["c"] == 3 and sum(got.values()) == 20


def test_policy_key_is_checked_in_the_recipe_and_the_sampler():
    from quantkit.recipe import CalibrationSettings, Recipe

    assert typing.get_args(typing.get_type_hints(CalibrationSettings)["policy"]) == POLICIES
    assert Recipe.from_dict({"scheme": "W4A16", "calibration": {"policy": "sqrt"}}).calibration.policy == "sqrt"
    refused = r"^recipe: calibration\.policy: must be 'traffic', 'sqrt' or 'balanced', got 'proportional'$"
    with pytest.raises(QuantkitError, match=refused):
        Recipe.from_dict({"scheme": "W4A16", "calibration": {"policy": "proportional"}})
    with pytest.raises(QuantkitError, match=r"^calibration\.policy: must be one of traffic, sqrt, balanced$"):
        SamplerConfig(policy="proportional")


def test_recipe_policy_reaches_the_sampler(tmp_path, units, tokenizer, tokenizer_dir):
    from quantkit.workflows.model_inputs import resolve_calibration
    from quantkit.recipe import Recipe

    log = _log(tmp_path / "log.jsonl", units, 10, 4, 400)   # traffic 1:10: sqrt and balanced differ
    recipe = Recipe.from_dict({"scheme": "W4A16", "calibration": {
        "policy": "sqrt", "num_samples": 30, "max_seq_len": 128, "seed": 2}})
    got = resolve_calibration(log, recipe, tokenizer_dir)
    cfg = dict(num_samples=30, max_len=128, seed=2)
    assert got == calibrate(log, tokenizer, SamplerConfig(policy="sqrt", **cfg)).input_ids
    assert got != calibrate(log, tokenizer, SamplerConfig(policy="balanced", **cfg)).input_ids
