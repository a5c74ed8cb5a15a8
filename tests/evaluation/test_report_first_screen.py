"""The main job's report.html and model card as a reviewer reads them in a minute, in English and in
Chinese, in headless Chromium at 1280 px (tests/browser.py; Chromium missing fails these tests).
Built from the main job's recorded result (tests/recorded_report.py: 23 reasons over 5 gated slices,
4 Chinese slices not gated, a clean integrity pass), not by running it: the first screen holds the
decision and one line per slice, every gating figure stands beside its limit, no header breaks
inside a word, not-gated slices say so, and no integrity cell reads -1."""
import re

import markdown as markdown_lib
import pytest
from browser import open_page
from recorded_report import main_job_card, main_job_data
from report_html import parse

from quantkit.evaluation.report import markdown, render_html, short
from quantkit.evaluation.report.content import columns
from quantkit.evaluation.report.gating import gated_figures
from quantkit.evaluation.report.words import WORDS

LANGS = ("en", "zh")
LEVELS = ("NO-GO", "REVIEW", "GO")


def _card_page(card: str, lang: str) -> str:
    """The card as a Markdown viewer shows it (the hub renders README.md with its tables)."""
    body = markdown_lib.markdown(card.split("\n---\n", 1)[1], extensions=["tables"])
    return (f"<!doctype html><html lang='{lang}'><head><meta charset='utf-8'><style>body{{font-family:sans-serif;"
            f"max-width:1200px;margin:auto}}td,th{{border:1px solid #ccc}}</style></head><body>{body}</body></html>")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """lang -> (report.json's dict, the report's folder), with report.html, report.md, card.md and
    card.html in it."""
    root = tmp_path_factory.mktemp("first-screen")
    out = {}
    for lang in LANGS:
        data, folder = main_job_data(lang), root / lang
        folder.mkdir()
        (folder / "report.html").write_text(render_html(data, {}, lang), encoding="utf-8")
        (folder / "report.md").write_text(markdown(data, lang), encoding="utf-8")
        card = main_job_card(data, lang)
        (folder / "card.md").write_text(card, encoding="utf-8")
        (folder / "card.html").write_text(_card_page(card, lang), encoding="utf-8")
        out[lang] = data, folder
    return out


@pytest.fixture(scope="module")
def pages(written):
    return {(lang, name): open_page(folder / f"{name}.html", width=1280)
            for lang, (_, folder) in written.items() for name in ("report", "card")}


def test_the_recorded_result_is_the_main_jobs_shape():
    data = main_job_data()
    v = data["verdict"]
    gated = {r["slice"] for r in v["reasons"]}
    assert data["decision"] == "NO-GO" and len(v["reasons"]) > 20 and len(gated) == 4
    assert set(v["not_gated"]) == {"numbers-zh", "code-zh", "names-zh", "long-zh"} and v["informational"]


@pytest.mark.parametrize("lang", LANGS)
def test_the_first_screen_holds_the_decision_and_one_line_per_slice(written, pages, lang):
    data, _ = written[lang]
    page = pages[(lang, "report")]
    first = page.first_screen
    assert data["decision"] in first[0]
    # the reason lines a reader sees before opening anything: "NO-GO names-en: kl_mean ..."
    lines = [t for t in first if t.split(" ", 1)[0] in LEVELS and re.match(r"\S+ [\w:-]+[:：]", t)]
    slices = [re.match(r"\S+ ([\w:-]+)[:：]", t).group(1) for t in lines]
    gating = {r["slice"] for r in data["verdict"]["reasons"]}
    assert len(slices) == len(set(slices)) and gating <= set(slices), lines   # each slice once at most
    # each line is the slice's worst reason, the others folded below it
    assert all(re.search(r"5 more below|另有 5 项见下方", t) for t in lines if " names-en" in t)
    assert "The other 19 reasons" in page.text or "其余 19 项原因" in page.text
    for r in data["verdict"]["reasons"]:                   # all of them one click away, limits beside
        sign = "<" if r["value"] < r["limit"] else ">"
        assert f"{r['measure']} {short(r['value'])} {sign} {short(r['limit'])}" in page.text, r


@pytest.mark.parametrize("lang", LANGS)
def test_every_gating_figure_stands_beside_its_limit_in_the_summary_and_the_slice_table(written, pages, lang):
    data, folder = written[lang]
    html = parse((folder / "report.html").read_text(encoding="utf-8"))
    shown = {c for c, _, _ in columns(data)}
    figures = gated_figures(data)
    in_table = [f for f in figures if f.measure in shown]
    assert len(in_table) > 20
    for f in in_table:                                    # the slice table: "0.482 > 0.1"
        assert html.limits[f"slices.{f.slice}.{f.measure}"] == f"{f.sign} {short(f.limit)}", f
    rows = html.tables["gating_all"]                       # the summary: value, limit, margin
    header = [t for t, _ in rows[0]]
    limit_at = header.index(WORDS.text(lang, "th_limit"))
    assert len(rows) - 1 == len(figures)
    assert [row[limit_at][0] for row in rows[1:]] == [f"{f.sign} {short(f.limit)}" for f in figures]
    page = pages[(lang, "report")]
    for f in in_table:
        assert f"{short(f.value)} {f.sign} {short(f.limit)}" in page.text, f
    # a not-gated slice's figures are shown without a limit: they judge nothing
    off = data["verdict"]["not_gated"]
    assert not [p for p in html.limits if p.split(".")[1] in off]


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("name", ["report", "card"])
def test_no_header_breaks_inside_a_word_and_the_page_fits(pages, lang, name):
    page = pages[(lang, name)]
    assert page.broken_headers == []
    assert page.scroll_width <= page.inner_width == 1280 and page.overflowing == []
    assert len(page.headings["th"]) > (5 if name == "report" else 2)


@pytest.mark.parametrize("lang", LANGS)
def test_slices_that_do_not_gate_say_so_in_the_report_and_the_card(written, pages, lang):
    data, folder = written[lang]
    off = data["verdict"]["not_gated"]
    words = WORDS.bind(lang)
    html = parse((folder / "report.html").read_text(encoding="utf-8"))
    rows = {row[0][0]: [t for t, _ in row] for row in html.tables["slices"][1:]}
    for name in data["slices"]:
        gates = rows[name][3]
        assert (words("not_gated") in gates) == (name in off), (name, gates)
    card = (folder / "card.md").read_text(encoding="utf-8")
    mark = "not gated" if lang == "en" else "不参与判定"
    for name, level in data["verdict"]["slices"].items():
        row = next(line for line in card.splitlines() if line.startswith(f"| {name} |"))
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[1].startswith(level) and (mark in cells[1]) == (name in off), row
        assert bool(cells[2]) == (level != "GO"), row       # a not-gated breach names its reason too
    card_text = pages[(lang, "card")].text
    assert all(f"{name}\t{data['verdict']['slices'][name]}" in card_text for name in off)


@pytest.mark.parametrize("lang", LANGS)
def test_integrity_is_shown_as_what_it_found_never_a_table_of_minus_one(written, pages, lang):
    data, folder = written[lang]
    assert all(m["recon_excess_db"] == -1.0 for m in data["integrity"]["modules"].values())   # a clean pass
    md = (folder / "report.md").read_text(encoding="utf-8")
    cells = [c.strip() for line in md.splitlines() if line.startswith("|") for c in line.strip("|").split("|")]
    assert cells and not [c for c in cells if re.fullmatch(r"-1(\.0+)?", c)]
    section = md.split(f"## {WORDS.text(lang, 'integrity')}", 1)[1].split("\n## ", 1)[0]
    assert "|" not in section and "-1.0 dB" in section    # one sentence: the closest part, no grid
    html = parse((folder / "report.html").read_text(encoding="utf-8"))
    assert not [t for rows in html.tables.values() for row in rows for t, _ in row if re.fullmatch(r"-1(\.0+)?", t)]
    assert "integrity_flagged" not in html.tables
