"""benchmarks/calibration_fidelity.py: the second log's split and the report's intervals.

The split is built small (a few hundred rows instead of 20,000) from the same code; the generic
text is given as an empty list so that the build does not fetch the kernel documentation.
"""
from __future__ import annotations

import importlib.util
import json
import random
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("calibration_fidelity", ROOT / "benchmarks" / "calibration_fidelity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(bench, path: Path) -> list[str]:
    return [bench.content_key(bench._content(json.loads(line))) for line in path.read_text(encoding="utf-8").splitlines()]


def test_second_log_splits_into_disjoint_traffic_and_held_out_logs(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "TRAFFIC_ROWS", 600)
    monkeypatch.setattr(bench, "SECOND_EVAL_ROWS", 6)
    monkeypatch.setattr(bench, "LABEL_EVAL_ROWS", 40)
    (tmp_path / "generic.json").write_text("[]", encoding="utf-8")
    paths = bench.build_logs("second", tmp_path)
    assert paths["traffic"].parent == paths["eval"].parent == tmp_path / "second"
    traffic = [json.loads(line) for line in paths["traffic"].read_text(encoding="utf-8").splitlines()]
    held = [json.loads(line) for line in paths["eval"].read_text(encoding="utf-8").splitlines()]
    assert not set(_keys(bench, paths["traffic"])) & set(_keys(bench, paths["eval"]))
    assert len(traffic) == 600 + bench.LONG_DOCUMENTS
    assert Counter(r["task"] for r in traffic)["classification"] == 360   # 60% of the rows
    assert Counter(r["task"] for r in held) == {"classification": 40, "long_document": bench.LONG_DOCUMENTS,
                                                **{t: 6 for t in bench.LABEL_TRAFFIC if t != "classification"}}
    assert {r["messages"][-1]["content"] for r in held if r["task"] == "classification"} <= set(bench.SENTIMENT)
    # built once: a second call reads the same files
    before = paths["eval"].read_bytes()
    assert bench.build_logs("second", tmp_path) == paths and paths["eval"].read_bytes() == before


def _runs(rows: dict[str, list[float]], seeds: int, shift: float, noise: float, rng: random.Random) -> dict:
    """seed -> a run's JSON line whose rows score ``kl * (1 + shift) + noise`` per token."""
    out = {}
    for s in range(seeds):
        per = {t: [[f"row-{i:03d}", 10, 10 * (k * (1 + shift) + rng.gauss(0, noise))] for i, k in enumerate(ks)]
               for t, ks in rows.items()}
        out[s] = {"rows": per, "slices": {t: {} for t in rows}}
    return out


def test_difference_separates_a_real_gain_from_noise(bench):
    rng = random.Random(0)
    rows = {t: [rng.uniform(0.05, 0.4) for _ in range(40)] for t in ("a", "b", "c")}
    random_rows = _runs(rows, 3, 0.0, 0.002, rng)
    better = bench.difference(_runs(rows, 3, -0.10, 0.002, rng), random_rows, sorted(rows))
    same = bench.difference(_runs(rows, 3, 0.0, 0.002, rng), random_rows, sorted(rows))
    assert bench.verdict(better["mean"]) == "lower beyond noise"
    assert all(bench.verdict(d) == "lower beyond noise" for d in better["tasks"].values())
    assert bench.verdict(same["mean"]) == "within noise"
    lo, hi = same["mean"]["ci"]
    assert lo < same["mean"]["diff"] < hi
    # the gain is 10% of each task's KL: the point difference recovers it
    for t, ks in rows.items():
        assert better["tasks"][t]["diff"] == pytest.approx(-0.10 * sum(ks) / len(ks), abs=0.003)


def test_one_seed_never_beats_random_rows(bench):
    rng = random.Random(1)
    rows = {t: [rng.uniform(0.05, 0.4) for _ in range(40)] for t in ("a", "b")}
    three = {"random": _runs(rows, 3, 0.0, 0.002, rng), "traffic": _runs(rows, 3, -0.10, 0.002, rng)}
    one = {"random": _runs(rows, 1, 0.0, 0.002, rng), "traffic": _runs(rows, 1, -0.10, 0.002, rng)}
    assert bench.beats_random(three, "traffic") == "BEATS random rows beyond noise"
    assert bench.beats_random(one, "traffic").startswith("undecided: one seed")
