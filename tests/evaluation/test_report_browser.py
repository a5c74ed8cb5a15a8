"""The evaluation report as a reader sees it, in headless Chromium (tests/browser.py): `quantkit
eval` of a tiny model against a real 4-bit quantkit checkpoint of it (RTN, group 64), written in
English and in Chinese. Chromium missing fails these tests (scripts/setup-browser.sh installs it)."""
import json
import re

import matplotlib.image
import pytest
import typer
import yaml
from browser import open_page, untranslated
from report_html import lookup, parse
from tiny import TINY_THRESHOLDS
from typer.testing import CliRunner

import quantkit
from quantkit.cli.eval_command import eval_command
from quantkit.evaluation.measures import MEASURES, table_columns
from quantkit.evaluation.report import integrity_grid, short
from quantkit.evaluation.report.content import VARIANT_COLUMNS
from quantkit.evaluation.report.html import INTEGRITY_COLUMNS

EVAL = {"suite": "numbers-en,code-en,long-en", "max_len": 384, "thresholds": TINY_THRESHOLDS,
        "options": {"text_items": 2, "extract_items": 2, "gen_prompts": 2, "gen_tokens": 4,
                    "extract_tokens": 4, "item_tokens": 64}}
# what stays as written in a Chinese report's headings besides the report's own names
SYMBOLS = {"quantkit", "KL", "GO", "REVIEW", "NO-GO", "lm-eval", "top-1", "SQNR", "dB", "kv", "token", "checkpoint"}


def app():
    a = typer.Typer()
    a.command()(eval_command)
    return a


@pytest.fixture(scope="module")
def reports(base, tok, tmp_path_factory):
    root = tmp_path_factory.mktemp("browser")
    base.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    quantkit.quantize(str(root / "base"), "w4a16-g64").save(root / "w4a16")
    (root / "recipe.yaml").write_text(yaml.safe_dump({"version": 1, "scheme": "W4A16", "eval": EVAL}))
    out = {}
    for lang in ("en", "zh"):
        out[lang] = root / f"report-{lang}"
        r = CliRunner().invoke(app(), ["--baseline", str(root / "base"), "--candidate", str(root / "w4a16"),
                                       "--recipe", str(root / "recipe.yaml"), "--out", str(out[lang]),
                                       "--lang", lang])
        assert r.exit_code == 0, r.output
    return out


def _data(folder):
    return json.loads((folder / "report.json").read_text(encoding="utf-8"))


def _symbols(data: dict) -> set[str]:
    names = set(data["slices"]) | set(data["thresholds"]) | {c for c, _, _ in table_columns()}
    names |= {v for per in (data.get("kl_by_position_variants") or {}).values() for v in per}
    if data.get("integrity"):   # the module kinds of the integrity grid: the model's own names
        names |= set(integrity_grid(data["integrity"])[1])
    return names | set(VARIANT_COLUMNS) | set(INTEGRITY_COLUMNS) | SYMBOLS


def _shape(x):
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_shape(v) for v in x]
    return type(x).__name__


def test_unknown_language_is_one_line_naming_the_flag(reports, tmp_path):
    r = CliRunner().invoke(app(), ["--candidate", str(reports["en"].parent / "w4a16"), "--out", str(tmp_path / "x"),
                                   "--lang", "fr"])
    assert r.exit_code == 2 and r.output == "error: --lang: expected one of en, zh, got 'fr'\n"
    assert not (tmp_path / "x").exists()


def test_report_json_is_the_same_in_both_languages_but_for_its_lang(reports):
    en, zh = _data(reports["en"]), _data(reports["zh"])
    assert (en["meta"]["lang"], zh["meta"]["lang"]) == ("en", "zh")
    assert _shape(en) == _shape(zh)
    assert en["verdict"] == zh["verdict"] and en["slices"] == zh["slices"] and en["decision"] == "NO-GO"


def test_no_english_heading_is_left_in_the_chinese_report(reports):
    data = _data(reports["zh"])
    allowed = _symbols(data)
    pages = {lang: open_page(reports[lang] / "report.html") for lang in ("en", "zh")}
    heads = {lang: [t for tag in ("h1", "h2", "h3", "th", "summary") for t in p.headings[tag]]
             for lang, p in pages.items()}
    assert len(heads["zh"]) == len(heads["en"]) > 40
    assert untranslated(heads["zh"], allowed) == []
    # the same check finds the English page's words: it is not blind
    assert {"Reasons", "Slices", "slice", "margin", "limit"} <= set(untranslated(heads["en"], allowed))
    for lang in ("en", "zh"):   # the Markdown's headings and table headers too
        md = (reports[lang] / "report.md").read_text(encoding="utf-8").splitlines()
        lines = [x for x in md if x.startswith("#")] + [x for x, below in zip(md, md[1:]) if below.startswith("|---")]
        found = untranslated([re.sub(r"`[^`]*`|\*\*", "", x) for x in lines], allowed)
        assert (found == []) == (lang == "zh"), (lang, found)
    assert "（" in pages["zh"].text and "原因" in pages["zh"].headings["h2"]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_page_fits_1280_px_and_shows_each_gating_figure_with_its_limit(reports, lang):
    folder = reports[lang]
    data = _data(folder)
    page = open_page(folder / "report.html", width=1280, screenshot=folder / "shot-1280.png")
    assert page.inner_width == 1280 and page.scroll_width <= page.inner_width
    assert page.overflowing == []
    shot = matplotlib.image.imread(page.screenshot)
    assert shot.shape[1] == 1280 and shot.std() > 0.05
    html = parse((folder / "report.html").read_text(encoding="utf-8"))
    reasons = [("reasons", i, r) for i, r in enumerate(data["verdict"]["reasons"])]
    reasons += [("informational", i, r) for i, r in enumerate(data["verdict"]["informational"])]
    assert len(reasons) > 5
    for key, i, r in reasons:
        value, limit = html.shown[f"verdict.{key}.{i}.value"], html.shown[f"verdict.{key}.{i}.limit"]
        assert (value, limit) == (short(r["value"]), short(r["limit"]))
        assert float(html.cells[f"verdict.{key}.{i}.value"]) == r["value"]
        sign = "<" if MEASURES[r["measure"]].higher_is_better else ">"
        assert f"{r['measure']} {value} {sign} {limit}" in page.text, r   # on one line, as a reader sees it
    # the page opens on the decision and its reasons
    top = page.text.split("\n")
    assert data["decision"] in top[0] and page.headings["h2"][0] in ("Reasons", "原因")
    # every number with a JSON path is shown at three significant digits
    assert len(html.shown) > 40 and all(text == short(lookup(data, p)) for p, text in html.shown.items())
