"""The README's main job, run as the README gives it (GPTQ W4A16 on the embedded SmolLM2, with its
evaluation; about 8 minutes on 2 cores): the checkpoint's model card carries the verdict table, and
the evaluation report, opened in headless Chromium at 1280 px, fits the window and shows every
gating figure beside its limit (tests/browser.py: Chromium missing fails this test)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser import open_page

from quantkit.evaluation.measures import MEASURES
from quantkit.evaluation.report import short

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def main_job(tmp_path_factory) -> Path:
    command = re.search(r"bash scripts/setup\.sh && \.venv/bin/quantkit (convert [^\n]+)", README).group(1).split()
    assert command[:3] == ["convert", "--recipe", "w4a16-g64-gptq"] and command[3] == "--out"
    out = tmp_path_factory.mktemp("main") / "smollm2-w4a16-gptq"
    res = subprocess.run([sys.executable, "-m", "quantkit.cli", *command[:4], str(out)], capture_output=True,
                         text=True, cwd=ROOT, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_the_main_jobs_card_shows_the_verdict_table(main_job):
    verdict = json.loads((main_job / "eval" / "report.json").read_text())["verdict"]
    card = (main_job / "README.md").read_text(encoding="utf-8")
    assert f"**{verdict['decision']}**" in card and "| slice | level | first reason |" in card
    for name, level in verdict["slices"].items():   # a slice that does not gate says so beside its level
        mark = ", not gated" if name in verdict["not_gated"] else ""
        assert re.search(rf"^\| {re.escape(name)} \| {level}{mark} \|", card, re.M), name


def test_the_main_jobs_report_fits_1280_px_with_each_gating_figure_beside_its_limit(main_job):
    folder = main_job / "eval"
    data = json.loads((folder / "report.json").read_text())
    page = open_page(folder / "report.html", width=1280, screenshot=folder.parent / "report-1280.png")
    assert page.inner_width == 1280 and page.scroll_width <= page.inner_width and page.overflowing == []
    reasons = data["verdict"]["reasons"] + data["verdict"]["informational"]
    assert reasons   # the main job is NO-GO: its reasons are on the page
    for r in reasons:
        sign = "<" if MEASURES[r["measure"]].higher_is_better else ">"
        assert f"{r['measure']} {short(r['value'])} {sign} {short(r['limit'])}" in page.text, r
