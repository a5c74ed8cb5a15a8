"""Calibration acceptance: a skewed 20k-row log of real text with malformed lines."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from quantkit.calibration import SamplerConfig, calibrate
from skewed_log import build_skewed_log

N, MAX_LEN = 512, 1024


@pytest.fixture(scope="module")
def skewed(tmp_path_factory, real_units, tokenizer):
    folder = tmp_path_factory.mktemp("skewed")
    log = folder / "traffic.jsonl"
    truth = build_skewed_log(log, real_units)
    cfg = SamplerConfig(num_samples=N, max_len=MAX_LEN, seed=11)
    first = calibrate(log, tokenizer, cfg, out=folder / "run1")
    second = calibrate(log, tokenizer, cfg, out=folder / "run2")
    return truth, first, second, folder


def test_every_nonempty_cell_is_represented(skewed):
    _, res, _, _ = skewed
    cells = res.manifest["cells"]
    assert len(cells) >= 12  # the log really spreads over many (task x length) cells
    for c in cells:
        assert c["distinct_rows"] > 0
        assert c["selected"] >= min(2, c["distinct_rows"]), c


def test_cell_shares_within_two_points_of_target(skewed):
    _, res, _, _ = skewed
    assert res.manifest["counts"]["selected"] == N
    worst = max(abs(c["sample_share"] - c["traffic_share"]) for c in res.manifest["cells"])
    assert worst <= 0.02, worst


def test_samples_file_agrees_with_manifest(skewed):
    _, res, _, folder = skewed
    lines = (folder / "run1" / "samples.jsonl").read_text(encoding="utf-8").splitlines()
    by_cell = Counter((json.loads(l)["task"], json.loads(l)["bucket"]) for l in lines)
    assert by_cell == Counter({(c["task"], c["bucket"]): c["selected"] for c in res.manifest["cells"]
                               if c["selected"]})
    for line in lines:
        s = json.loads(line)
        assert len(s["input_ids"]) == s["tokens"] <= MAX_LEN


def test_task_types_from_field_and_inferred(skewed):
    truth, res, _, _ = skewed
    src = {t["name"]: t["distinct_rows"] for t in res.manifest["tasks"]}
    assert res.manifest["task_source"]["source"]["field"] == sum(
        truth["tasks"][t] for t in ("chat", "code", "translation", "classification"))
    for task, rows in truth["tasks"].items():
        if task in ("chat", "code", "translation", "classification"):  # labelled: exact, plus any
            assert rows <= src[task] <= 1.05 * rows, task              # inferred rows of that type
        else:  # inferred by the rules: they recover the generator's task for >= 95% of rows
            assert 0.95 * rows <= src.get(task, 0) <= 1.05 * rows, (task, src.get(task), rows)
    assert res.manifest["task_source"]["source"]["inferred"] > 0


def test_malformed_lines_counted_by_reason(skewed):
    truth, res, _, _ = skewed
    got = res.manifest["malformed"]
    assert {r: d["first_lines"] for r, d in got.items()} == truth["malformed"]
    assert res.manifest["counts"]["malformed"] == sum(len(v) for v in truth["malformed"].values())
    assert res.manifest["counts"]["rows_read"] == 20_000


def test_truncation_is_counted(skewed):
    _, res, _, folder = skewed
    counts = res.manifest["counts"]
    samples = [json.loads(l) for l in (folder / "run1" / "samples.jsonl").read_text().splitlines()]
    assert counts["truncated_source"] > 0
    assert counts["truncated_selected"] == sum(s["truncated"] for s in samples) > 0
    assert all(s["tokens"] == MAX_LEN for s in samples if s["truncated"])


def test_same_seed_byte_identical(skewed):
    _, _, _, folder = skewed
    names = sorted(p.name for p in (folder / "run1").iterdir())
    assert names == [".quantkit-output.json", "manifest.json", "report.html", "report.json", "report.md", "samples.jsonl"]
    for name in names:
        assert (folder / "run1" / name).read_bytes() == (folder / "run2" / name).read_bytes(), name
