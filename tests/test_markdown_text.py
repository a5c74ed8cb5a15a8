"""User text in Markdown: inert HTML, one table cell, verbatim code spans."""

from __future__ import annotations

from quantkit.common.markdown import md_code, md_row, md_text

HOSTILE = "business:<img src=x onerror=alert(1)> | a`b\\\nnext & more"


def test_md_text_escapes_html_cells_and_line_breaks():
    out = md_text(HOSTILE)
    assert "<img" not in out and "&lt;img src=x onerror=alert(1)&gt;" in out
    assert "\\|" in out and "\\`" in out and "&amp; more" in out and "\n" not in out
    assert md_text("plain text, 0.25 - it's fine") == "plain text, 0.25 - it's fine"


def test_md_row_keeps_each_value_in_its_own_cell():
    row = md_row([HOSTILE, 3])
    assert row.startswith("| ") and row.endswith(" | 3 |")
    unescaped_pipes = row.replace("\\|", "").count("|")
    assert unescaped_pipes == 3   # the row's own: no value split into two cells


def test_md_code_fences_past_the_backticks_it_holds():
    assert md_code("a/b") == "`a/b`"
    assert md_code("x``y") == "```x``y```"
    assert md_code("`edge") == "`` `edge ``"
    assert "\n" not in md_code("two\nlines")
