"""Hostile text and the checks that a written document kept it as text (tests/end_to_end/test_hostile_strings.py,
tests/evaluation/test_eval_report.py)."""
from __future__ import annotations

from html.parser import HTMLParser

from hypothesis import strategies as st
from markdown_it import MarkdownIt

PIECES = ["# heading", "<img src=x onerror=alert(1)>", "[click](javascript:alert(1))", "![i](http://127.0.0.1/x.png)",
          "<!--<script>", "</script><script>alert(1)</script>", "a|b", "x\ny", "`code`", "<https://evil>", "&lt;",
          "<a href='javascript:alert(1)'>a</a>", "\\", "*em*", "> quote", "---"]
HOSTILE = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=8)), min_size=1, max_size=4).map("".join)


def markdown_problems(text: str) -> list[str]:
    """Elements in a Markdown document that no quantkit document writes: raw HTML (but its own
    line breaks), images, links other than https, more than one top heading."""
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    children = [c for t in tokens for c in (t.children or [])]
    out = [f"html block {t.content[:40]!r}" for t in tokens if t.type == "html_block"]
    out += [f"html {c.content!r}" for c in children if c.type == "html_inline" and c.content != "<br>"]
    out += [f"image {c.attrs}" for c in children if c.type == "image"]
    out += [f"link {c.attrs}" for c in children if c.type == "link_open" and not str(c.attrs.get("href")).startswith("https://")]
    if sum(t.type == "heading_open" and t.tag == "h1" for t in tokens) > 1:
        out.append("a second top heading")
    return out


URL_ATTRIBUTES = {"href", "src", "action", "formaction", "xlink:href", "poster", "srcset"}


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs


def html_problems(page: str, allowed: set[str]) -> list[str]:
    parser = _Elements()
    parser.feed(page)
    out = [f"element <{t}>" for t in set(parser.tags) - allowed]
    out += [f"attribute {k}={v!r}" for k, v in parser.attrs
            if k.startswith("on") or (k in URL_ATTRIBUTES and "javascript:" in str(v).lower())]
    return out
