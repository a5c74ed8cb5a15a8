"""The load test's report in English and Chinese (`--lang`) as headless Chromium lays it out
(tests/browser.py; Chromium missing fails these tests): the Chinese page has no English heading,
both fit a 1280 px window, and the figures are the same in both."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from browser import open_page, untranslated

from quantkit.common.outputs import OutputPolicy
from quantkit.loadtest import loadtest_report as report
from quantkit.loadtest.ramp import RampPolicy
from quantkit.loadtest.slo import parse_slo
from quantkit.workflows.loadtest import Ramp, length_model, report_data, run_ramp

sys.path.insert(0, str(Path(__file__).parent))
from test_ramp_loop import _stream, modelled_server  # noqa: E402


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    slo = parse_slo("ttft=2s,tpot=50ms")
    ramps = [run_ramp(Ramp(role), modelled_server(slots=s, tpot=t)[0], _stream(), RampPolicy(), slo)
             for role, s, t in (("baseline", 4, 0.03), ("candidate", 8, 0.02))]
    traffic = SimpleNamespace(prompt_tokens=[50, 60, 80, 200, 900, 120, 300], output_tokens=[5, 9, 20, 40, 300, 12, 7])
    _, lengths = length_model(traffic, 2048)
    data = report_data({"complete": True, "slo": slo.to_dict(), "lengths": lengths, "max_model_len": 2048,
                        "ramps": ramps})
    folder = tmp_path_factory.mktemp("lt")
    return {lang: report.save(data, folder / lang, OutputPolicy("loadtest"), lang=lang) for lang in ("en", "zh")}


def test_only_the_words_differ(reports):
    en, zh = (json.loads((reports[lang] / "report.json").read_text()) for lang in ("en", "zh"))
    assert {**en, "lang": None} == {**zh, "lang": None} and (en["lang"], zh["lang"]) == ("en", "zh")
    assert "## 阶梯：候选" in (reports["zh"] / "report.md").read_text()
    assert "## Steps: candidate" in (reports["en"] / "report.md").read_text()


def test_chinese_page_has_no_english_heading_and_both_fit_1280(reports):
    allowed = {"P50", "P90", "P99", "TTFT", "TPOT", "ITL", "E2E", "ms", "mu", "sigma", "token"}
    pages = {lang: open_page(folder / "report.html", width=1280) for lang, folder in reports.items()}
    heads = {lang: [t for tag in ("h1", "h2", "th") for t in p.headings[tag]] for lang, p in pages.items()}
    assert len(heads["zh"]) == len(heads["en"]) > 20
    assert untranslated(heads["zh"], allowed) == []
    assert {"Steps", "concurrency", "goodput"} <= set(untranslated(heads["en"], allowed))   # the check sees English
    for page in pages.values():
        assert page.scroll_width <= page.inner_width == 1280 and page.overflowing == []
    # the knee and the recommendation are on the page, in both languages
    data = json.loads((reports["en"] / "report.json").read_text())
    assert f"knee at concurrency {data['knee']}, run at {data['recommended_concurrency']}" in pages["en"].text
    assert f"拐点在并发 {data['knee']}，建议按 {data['recommended_concurrency']} 运行" in pages["zh"].text
