"""User text in Markdown: inert HTML, one table cell, verbatim code spans."""

from __future__ import annotations

from quantkit.common.markdown_text import md_code, md_row, md_text

HOSTILE = "business:<img src=x onerror=alert(1)> | a`b\\\nnext & more"


def test_md_text_escapes_html_cells_and_line_breaks():
    out = md_text(HOSTILE)
    assert "<img" not in out and "&lt;img src=x onerror=alert(1)&gt;" in out
    assert "\\|" in out and "\\`" in out and "& more" in out and "\n" not in out
    assert md_text("plain text, 0.25 - it's fine") == "plain text, 0.25 - it's fine"


def test_md_text_leaves_plain_text_as_a_reader_sees_it():
    """Comparisons, brackets and a lone ``&`` read the same raw and rendered: no ``&gt;``, no ``\\[``."""
    said = "numbers-en: kl_mean 0.31 > 0.1 (over by 0.21); top1_agreement 0.62 < 0.75 [0.58, 0.66] & more"
    assert md_text(said) == said
    assert md_text("&lt;") == "&amp;lt;"                   # an entity stays the text it is
    assert md_text("[x](javascript:alert(1))") == "[x\\](javascript:alert(1))"   # never a link
    assert md_text("C:\\dir\\") == "C:\\dir\\\\"          # a trailing backslash cannot eat the cell's |


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
