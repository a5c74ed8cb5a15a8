"""The coverage report in English and in Chinese (`--lang`): the same files but for the words of
report.md and report.html, the Chinese page without an English heading, both fitting a 1280 px
window in headless Chromium (tests/browser.py; Chromium missing fails these tests)."""
from __future__ import annotations

import json
import re

import pytest
import typer
from browser import open_page, untranslated
from typer.testing import CliRunner

from quantkit.calibration import calibrate
from quantkit.cli.calibrate_command import calibrate_command


@pytest.fixture(scope="module")
def reports(tmp_path_factory, default_rows, tokenizer):
    folder = tmp_path_factory.mktemp("lang")
    log = folder / "log.jsonl"
    log.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in default_rows[:300]) + "{bad\n")
    return {lang: calibrate(log, tokenizer, out=folder / lang, num_samples=48, max_len=1024, seed=3, lang=lang)
            for lang in ("en", "zh")}


def _cells(html: str) -> list[str]:
    return re.findall(r"<td>([^<]*)</td>", html)


def test_only_the_words_differ(reports):
    en, zh = reports["en"], reports["zh"]
    for name in ("samples.jsonl", "manifest.json", "report.json"):
        assert en.files[name] == zh.files[name], name
    html = {lang: r.files["report.html"].decode() for lang, r in reports.items()}
    # every table cell but the counts' labels is a number or the user's name: the same in both
    labels = {lang: set(re.findall(r"<tr><td>([^<]*)</td><td>\d+</td></tr>", h)) for lang, h in html.items()}
    assert "rows read" in labels["en"] and "读取的行" in labels["zh"]
    assert [c for c in _cells(html["en"]) if c not in labels["en"]] == \
        [c for c in _cells(html["zh"]) if c not in labels["zh"]]
    assert "<html lang=\"zh-CN\">" in html["zh"] and "## 任务类型" in zh.files["report.md"].decode()


def test_chinese_page_has_no_english_heading_and_both_fit_1280(reports):
    m = reports["zh"].manifest
    allowed = {t["name"] for t in m["tasks"]} | {b["name"] for b in m["buckets"]}
    allowed.add("token")   # the glossary keeps it as written (docs/zh/glossary.md)
    pages = {lang: open_page(r.out / "report.html", width=1280) for lang, r in reports.items()}
    heads = {lang: [t for tag in ("h1", "h2", "h3", "th") for t in p.headings[tag]] for lang, p in pages.items()}
    assert len(heads["zh"]) == len(heads["en"]) > 30
    assert untranslated(heads["zh"], allowed) == []
    assert {"Counts", "count", "selected"} <= set(untranslated(heads["en"], allowed))   # the check sees English
    for page in pages.values():
        assert page.scroll_width <= page.inner_width == 1280 and page.overflowing == []
    assert "图" in pages["zh"].headings["h2"] and "校准集覆盖报告" in pages["zh"].text


def test_unknown_language_is_one_line_naming_the_flag(tmp_path, tokenizer_dir):
    app = typer.Typer()
    app.command()(calibrate_command)
    r = CliRunner().invoke(app, ["--model", str(tokenizer_dir), "--out", str(tmp_path / "o"), "--lang", "de"])
    assert r.exit_code == 2 and r.output == "error: --lang: expected one of en, zh, got 'de'\n"
    assert not (tmp_path / "o").exists()


def test_length_buckets_read_in_numeric_order(reports):
    """65-128 before 129-256, not after it as text sorts them, in the cells of the manifest and the report."""
    m = reports["zh"].manifest
    start = {b: int(re.match(r"\d+", b).group()) for b in m["bucket_labels"]}
    by_task: dict[str, list[str]] = {}
    for c in m["cells"]:
        by_task.setdefault(c["task"], []).append(c["bucket"])
    assert max(len(b) for b in by_task.values()) >= 3
    assert all(b == sorted(b, key=start.get) for b in by_task.values()), by_task
    md = reports["zh"].files["report.md"].decode()
    cells = md.split("## 单元", 1)[1].split("\n## ", 1)[0]
    shown = [line.split(" | ")[1] for line in cells.splitlines() if line.startswith("| ") and " | " in line][1:]
    assert shown == [c["bucket"] for c in m["cells"]]


def test_no_header_breaks_inside_a_word_at_1280(reports):
    for r in reports.values():
        assert open_page(r.out / "report.html", width=1280).broken_headers == []
