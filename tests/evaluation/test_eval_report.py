"""Acceptance 4: the HTML renders with its plots and its numbers equal the JSON's."""
import base64
import contextlib
import io
import json

import matplotlib.image
import pytest
from report_html import check_table, lookup, parse
from tiny import FAST, TINY_THRESHOLDS, _take
from tiny import broken_past, fake_quant_linears

from quantkit.evaluation import evaluate, load_suite
from quantkit.evaluation.slice_scoring import HIDDEN
from quantkit.errors import QuantkitError
from quantkit.evaluation.slices import Slice
from quantkit.common.markdown_text import md_text
from quantkit.evaluation.report import short


@pytest.fixture(scope="module")
def saved(base, tok, tmp_path_factory):
    suite = [_take(s, 3) for s in load_suite("numbers-en,code-en,long-en")]
    suite.append(Slice("business:support", [{"id": "r1", "kind": "text",
                                             "text": "Customer ACME-7731 asked for a refund of 4,250 yuan on order 88-123."}],
                       public=False))
    # a little error everywhere (4-bit) and a lot past position 1024
    cand = broken_past(fake_quant_linears(base, 4, group=32), 1024, 3.0)
    # variants scored beside it on the long slice: its 4-bit weights alone, and an 8-bit copy
    variants = {"4-bit only": lambda m: contextlib.nullcontext(fake_quant_linears(base, 4, group=32)),
                "8-bit": lambda m: contextlib.nullcontext(fake_quant_linears(base, 8))}
    r = evaluate(base, cand, tok, suite=suite, max_len=1536, thresholds=TINY_THRESHOLDS, variants=variants,
                 options=FAST, progress=False, module_errors={"model.layers.0.mlp.up_proj": 31.5,
                                                              "model.layers.1.mlp.up_proj": 12.25},
                 footprint={"kv_bytes_per_token": 4096, "concurrency": 3},
                 meta={"baseline": "tiny", "candidate": "tiny-broken"})
    out = r.save(tmp_path_factory.mktemp("rep") / "eval")
    return r, out


def test_html_numbers_equal_the_json(saved):
    _, out = saved
    data = json.loads((out / "report.json").read_text())
    p = parse((out / "report.html").read_text())
    assert len(p.cells) > 40
    for path, text in p.cells.items():
        value = lookup(data, path)
        assert float(text) == value, (path, text, value)
    # every slice measure of the JSON shows up in the HTML table
    for name, vals in data["slices"].items():
        for m in ("kl_mean", "top1_agreement", "ppl_base"):
            if vals.get(m) is not None:
                assert f"slices.{name}.{m}" in p.cells


def test_every_number_of_the_html_slice_tables_is_the_jsons(saved):
    """The gated measures in the slice table, the figures they come from in the folded tables
    beside it: together every slice figure of the JSON, each shown at three significant digits."""
    _, out = saved
    data = json.loads((out / "report.json").read_text())
    page = parse((out / "report.html").read_text())
    rows = page.tables["slices"]
    assert [text for text, _ in rows[0]][:4] == ["slice", "language", "verdict", "gates"]
    assert [r[0][0] for r in rows[1:]] == list(data["slices"])
    for row in rows[1:]:
        assert row[2][0] == data["verdict"]["slices"][row[0][0]]
    assert {c for c, _ in rows[0][4:]} <= set(data["thresholds"])   # the main table: gated measures only
    checked = check_table(rows, data, lambda row, col: f"slices.{row[0][0]}.{col}", 4)
    shown = [c for c, _ in rows[0][4:]]
    groups = [t for t in page.tables if t.startswith("slices-")]
    assert "slices-perplexity" in groups
    for table in groups:
        group = page.tables[table]
        checked += check_table(group, data, lambda row, col: f"slices.{row[0][0]}.{col}", 1)
        shown += [c for c, _ in group[0][1:]]
    assert checked == sum(v.get(c) is not None for v in data["slices"].values() for c in shown) > 30
    for path, text in page.shown.items():
        value = lookup(data, path)
        assert text == short(value), (path, text)


def test_html_is_self_contained_with_its_plots(saved):
    _, out = saved
    html = (out / "report.html").read_text()
    p = parse(html)
    alts = {i["alt"] for i in p.images}
    assert alts == {"per-slice measures", "KL by position", "per-module error"}
    for img in p.images:
        assert img["src"].startswith("data:image/png;base64,")
        png = base64.b64decode(img["src"].split(",", 1)[1])
        pixels = matplotlib.image.imread(io.BytesIO(png), format="png")
        assert pixels.shape[0] > 150 and pixels.shape[1] > 300 and pixels.std() > 0.01  # not blank
    assert "http://" not in html and "https://" not in html and "<script" not in html


def test_markdown_and_json_agree_on_the_verdict(saved):
    r, out = saved
    data = json.loads((out / "report.json").read_text())
    md = (out / "report.md").read_text()
    assert data["decision"] == r.decision == "NO-GO"
    assert md.startswith(f"# quantkit evaluation: **{r.decision}**")
    for reason in data["verdict"]["reasons"]:
        assert md_text(reason["text"]) == reason["text"] and reason["text"] in md   # plain text, raw and rendered
    assert data["kl_by_position"]["long-en"][-1]["kl_mean"] > 0.2


def test_variants_sit_beside_the_candidate_and_never_decide(saved):
    r, out = saved
    data = json.loads((out / "report.json").read_text())
    v = data["kl_by_position_variants"]["long-en"]
    assert list(v) == ["4-bit only", "8-bit"] and set(data["kl_by_position_variants"]) == {"long-en"}
    # the 4-bit weights alone show no jump past 1024; the candidate (4-bit + the late fault) does
    four, cand = v["4-bit only"]["buckets"], data["kl_by_position"]["long-en"]
    assert [b["start"] for b in four] == [b["start"] for b in cand]
    assert cand[-1]["kl_mean"] > 2 * four[-1]["kl_mean"] and cand[0]["kl_mean"] == pytest.approx(four[0]["kl_mean"])
    assert v["8-bit"]["level"] == "GO" and v["8-bit"]["kl_last_bucket"] < 0.02
    assert {x.slice for x in r.verdict.reasons} >= {"long-en"} and "8-bit" not in json.dumps(data["verdict"])
    md = (out / "report.md").read_text()
    assert "| positions | tokens | candidate | 4-bit only | 8-bit |" in md
    html_cells = parse((out / "report.html").read_text()).cells
    assert "kl_by_position_variants.long-en.8-bit.buckets.0.kl_mean" in html_cells
    assert "kl_by_position_variants.long-en.4-bit only.kl_last_bucket" in html_cells


def test_business_text_stays_out_unless_asked(saved, base, tok, tmp_path):
    r, out = saved
    assert r.verdict.slices["business:support"] != "GO"
    for f in ("report.json", "report.md", "report.html"):
        text = (out / f).read_text()
        assert "ACME-7731" not in text and "refund" not in text
    assert md_text(HIDDEN) in (out / "report.md").read_text()   # its brackets escaped: text, not a link
    shown = evaluate(base, broken_past(base, 8, 3.0), tok,
                     suite=[Slice("business:support", [{"id": "r1", "kind": "text",
                                                         "text": "Customer ACME-7731 asked for a refund."}], public=False)],
                     max_len=64, options=FAST, progress=False, show_samples=True)
    assert "ACME" in json.dumps(shown.to_json())


def test_save_replaces_atomically(saved, tmp_path):
    r, _ = saved
    out = r.save(tmp_path / "rep")
    (out / "stale.txt").write_text("x")
    with pytest.raises(QuantkitError, match="rep: output folder exists"):
        r.save(tmp_path / "rep")
    assert (out / "stale.txt").exists()
    r.save(tmp_path / "rep", overwrite=True)
    assert sorted(p.name for p in (tmp_path / "rep").iterdir()) == [".quantkit-output.json", "report.html",
                                                                     "report.json", "report.md"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_the_candidate_line_names_the_kv_option_it_runs(saved):
    from quantkit.evaluation.report import markdown
    _, out = saved
    data = json.loads((out / "report.json").read_text())
    assert "| positions | tokens | candidate | " in markdown(data)
    data["meta"]["kv"] = [{"option": "int8-kivi:k", "engine": None, "scales": "dynamic"}]
    assert "| positions | tokens | candidate (kv int8-kivi:k) | 4-bit only | 8-bit |" in markdown(data)


def test_markdown_report_escapes_user_slice_names(saved):
    """Slice names and task labels come from the user's files: the real renderer keeps them text."""
    from quantkit.evaluation.report import markdown

    _, out = saved
    data = json.loads((out / "report.json").read_text())
    name, evil = next(iter(data["slices"])), "business:<img src=x onerror=alert(1)> | x"
    data["slices"][evil] = data["slices"][name]
    data["verdict"]["slices"][evil] = data["verdict"]["slices"][name]
    data["warnings"] = [*data["warnings"], f"slice {evil}: line one\nline two"]
    md = markdown(data)
    assert "<img" not in md
    row = next(line for line in md.splitlines() if "onerror" in line and line.startswith("| "))
    assert row.startswith("| business:&lt;img src=x onerror=alert(1)&gt; \\| x |")
    head = next(line for line in md.splitlines() if line.startswith("| slice |"))
    assert row.replace("\\|", "").count("|") == head.count("|")   # still one cell per column
    assert "line one<br>line two" in md


def test_the_chinese_page_of_a_report_with_every_section_leaves_no_english_heading(saved, tmp_path):
    """Variants, business rows, a not-gated slice, footprint, worst examples: each section's headings
    and table labels in Chinese, as Chromium renders them (the browser test covers a real checkpoint)."""
    from browser import open_page, untranslated

    from quantkit.evaluation.measures import table_columns
    from quantkit.evaluation.report import plots, render_html
    from quantkit.evaluation.report.content import BUSINESS_COLUMNS, VARIANT_COLUMNS

    _, out = saved
    data = json.loads((out / "report.json").read_text())
    data["meta"]["business"] = {"log": "log.jsonl", "checked_against": None,
                                "tasks": {"support": {k: 1 for k in BUSINESS_COLUMNS}}}
    data["verdict"]["not_gated"] = {"long-en": "not gated (--languages: zh)"}
    images, drawn = plots(data, "zh")
    (tmp_path / "zh.html").write_text(render_html(data, images, "zh", drawn), encoding="utf-8")
    page = open_page(tmp_path / "zh.html")
    heads = [t for tag in ("h1", "h2", "h3", "th", "summary") for t in page.headings[tag]]
    allowed = set(data["slices"]) | set(data["thresholds"]) | {c for c, _, _ in table_columns()} | \
        set(VARIANT_COLUMNS) | set(data["kl_by_position_variants"]["long-en"]) | {"quantkit", "KL", "NO-GO", "REVIEW", "GO"} | \
        {"token", "checkpoint"}   # the glossary's terms that stay as written (docs/zh/glossary.md)
    assert drawn == "zh" and "业务数据" in page.headings["h2"] and "不参与判定（命令行参数 --languages 只列出 zh）" in page.text
    assert untranslated(heads, allowed) == []
    assert page.scroll_width <= page.inner_width


def test_without_a_chinese_font_the_plots_are_in_english_and_the_page_says_so(saved, monkeypatch):
    from quantkit.common import plotfonts
    from quantkit.evaluation.report import plots, render_html

    _, out = saved
    data = json.loads((out / "report.json").read_text())
    monkeypatch.setattr(plotfonts, "cjk_family", lambda: None)
    images, drawn = plots(data, "zh")
    assert drawn == "en" and set(images) == {"slices", "position", "modules"}
    page = parse(render_html(data, images, "zh", drawn))
    assert [i["alt"] for i in page.images] == ["各切片指标", "按位置的 KL", "逐模块误差"]
    assert "id='plot_language'" in render_html(data, images, "zh", drawn)
    assert "id='plot_language'" not in render_html(data, images, "zh", "zh")


@pytest.mark.parametrize("text", ["# heading <img src=x onerror=alert(1)>", "[click](javascript:alert(1)) | x\ny",
                                  "<!--<script></script>", "![i](http://127.0.0.1/x.png) `c`"])
def test_both_reports_keep_user_and_server_text_as_text(saved, text):
    """Slice names (the user's task labels), warnings (a server's own words) and the models' names
    go into report.md and report.html as text: no element, link or image comes from them."""
    from hostile_text import html_problems, markdown_problems

    from quantkit.evaluation.report import markdown, plots, render_html

    _, out = saved
    data = json.loads((out / "report.json").read_text())
    images, drawn = plots(data, "en")   # drawn from the clean figures: the words are what is checked
    name = next(iter(data["slices"]))
    data["slices"][f"business:{text}"] = data["slices"][name]
    data["verdict"]["slices"][f"business:{text}"] = data["verdict"]["slices"][name]
    data["warnings"] = [*data["warnings"], f"--endpoint: http://127.0.0.1:1/v1/completions: HTTP 500: {text}"]
    for key in ("baseline", "candidate"):
        if isinstance(data["meta"].get(key), str):
            data["meta"][key] = text
    assert markdown_problems(markdown(data)) == []
    page = render_html(data, images, "en", drawn)
    assert html_problems(page, {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "ul", "ol",
                                "li", "table", "thead", "tbody", "tr", "th", "td", "img", "details", "summary", "div",
                                "span", "code", "b", "strong", "em", "br", "a", "section", "figure", "figcaption",
                                "small", "pre", "caption", "colgroup", "col", "sup", "sub", "svg", "script", "wbr"}) == []
    assert page.count("<script") == (render_html(json.loads((out / "report.json").read_text()), images, "en", drawn)
                                     .count("<script"))
