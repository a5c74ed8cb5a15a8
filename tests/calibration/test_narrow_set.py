"""A calibration sample of one task type is called narrow, with its effective number of task types,
in the manifest, the coverage report (English and Chinese) and the lines a conversion logs; the
sampler's traffic sample of the embedded default log is not."""
from __future__ import annotations

import html
import json

import pytest

from quantkit.calibration import calibrate, load_calibration
from quantkit.calibration.manifest import NARROW_TASK_TYPES, effective_task_types, narrow_warning

NARROW = "narrow calibration set: "


def _narrow(warnings: list[str]) -> list[str]:
    return [w for w in warnings if w.startswith(NARROW)]


@pytest.fixture(scope="module")
def one_task_log(tmp_path_factory, default_rows):
    """The default log's classification rows alone: what a team calibrating its classifier gives."""
    path = tmp_path_factory.mktemp("narrow") / "classification.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in default_rows
                            if r["task"] == "classification"), encoding="utf-8")
    return path


def test_a_one_task_sample_is_narrow_and_the_traffic_sample_is_not(tokenizer, one_task_log):
    narrow = calibrate(one_task_log, tokenizer, num_samples=32, max_len=512, seed=0).manifest
    traffic = calibrate(None, tokenizer, num_samples=32, max_len=512, seed=0).manifest
    assert narrow["task_coverage"] == {"task_types": 1, "log_task_types": 1, "effective_task_types": 1.0,
                                       "narrow_below": NARROW_TASK_TYPES}
    assert _narrow(narrow["warnings"]) == [
        "narrow calibration set: the sample covers 1 task type (classification 32), 1.00 effective (< 2); "
        "calibrated on one kind of text, a low-bit model can lose quality on every other kind it serves: "
        "add traffic of its other tasks, and check the verdict on their slices (--calib)"]
    assert _narrow(traffic["warnings"]) == []
    assert traffic["task_coverage"]["task_types"] == traffic["task_coverage"]["log_task_types"] == 8
    assert traffic["task_coverage"]["effective_task_types"] > 3 * NARROW_TASK_TYPES


def test_the_report_says_so_in_english_and_chinese(tokenizer, one_task_log, tmp_path):
    for lang, words in (("en", ("task types in the sample: 1 of the log's 1, 1.00 effective", NARROW)),
                        ("zh", ("样本中的任务类型：日志 1 种中的 1 种，有效任务类型数 1.00", "校准集过窄：样本只覆盖 1 种任务类型"))):
        out = calibrate(one_task_log, tokenizer, num_samples=16, max_len=256, seed=1, out=tmp_path / lang, lang=lang)
        for name in ("report.md", "report.html"):
            text = html.unescape((out.out / name).read_text(encoding="utf-8"))
            assert all(w in text for w in words), (lang, name)
        assert _narrow(json.loads((out.out / "report.json").read_text())["warnings"])


def test_where_the_line_is_drawn():
    assert effective_task_types([128]) == 1.0 and effective_task_types([64, 64]) == pytest.approx(2.0)
    assert narrow_warning(["chat"] * 120 + ["code"] * 8, [False] * 128).startswith(
        f"{NARROW}the sample covers 2 task types (chat 120, code 8), 1.26 effective")
    assert narrow_warning(["chat"] * 64 + ["code"] * 64, [False] * 128) is None
    assert narrow_warning(["chat"] * 40 + ["code"] * 40 + ["math"] * 40, [False] * 120) is None
    # raw text the user chose (no request, no label) is generic text, not a narrow cut of traffic
    assert narrow_warning(["text"] * 64, [True] * 64) is None
    assert narrow_warning([], []) is None


def test_a_conversion_is_told_from_a_log_and_from_a_sampler_folder(tokenizer, one_task_log, tmp_path):
    for source in (one_task_log, calibrate(one_task_log, tokenizer, num_samples=24, max_len=256,
                                           out=tmp_path / "calib").out):
        told: list[str] = []
        load_calibration(source, tokenizer, 16, 256, warn=told.append)
        assert [w.split(": ", 1)[1] for w in told if NARROW in w] == [
            narrow_warning(["classification"] * 16, [False] * 16)], told
    told = []
    load_calibration(None, tokenizer, 16, 256, warn=told.append)
    assert not [w for w in told if NARROW in w]
