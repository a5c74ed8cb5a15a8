"""Whatever a user's files or a server say, what quantkit writes keeps it as text: the model card,
the load test's and the calibration's reports in Markdown and HTML. Hostile strings (Markdown
headings, links and images, raw HTML, a ``javascript:`` scheme, script-data openers, table pipes,
line breaks, backticks) go into every field a user or a server controls; the documents are parsed
and must hold no element, link or image that came from them."""
from __future__ import annotations

import json
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from quantkit.loadtest import report as loadtest_report
from quantkit.loadtest.ramp import RampPolicy
from quantkit.loadtest.slo import parse_slo
from quantkit.workflows.loadtest import Ramp, length_model, report_data, run_ramp
from quantkit.workflows.model_card import CardFacts, render

sys.path.insert(0, str(Path(__file__).parent / "loadtest"))
from test_ramp_loop import _stream, modelled_server  # noqa: E402

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
    out += [f"attribute {k}={v!r}" for k, v in parser.attrs if k.startswith("on") or "javascript:" in str(v)]
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=HOSTILE, reason=HOSTILE)
def test_the_model_card_keeps_names_and_reasons_as_text(name, reason):
    facts = CardFacts(base_model=name, recipe=name, groups=[], ignore=[name], kv_cache=None, shard_bytes=1, shards=1,
                      calibration={}, verdict={"decision": "GO", "slices": {name: "GO"},
                                               "reasons": [{"slice": name, "text": reason}]}, lang="en")
    card = render(facts)
    assert markdown_problems(card.split("---\n", 2)[2]) == []


@pytest.fixture(scope="module")
def loadtest_data():
    slo = parse_slo("ttft=2s,tpot=50ms")
    ramps = [run_ramp(Ramp(role), modelled_server(slots=s, tpot=t)[0], _stream(), RampPolicy(max_concurrency=4), slo)
             for role, s, t in (("baseline", 4, 0.03), ("candidate", 8, 0.02))]
    traffic = SimpleNamespace(prompt_tokens=[50, 60, 80, 200, 900, 120, 300], output_tokens=[5, 9, 20, 40, 300, 12, 7])
    _, lengths = length_model(traffic, 2048)
    return report_data({"complete": False, "slo": slo.to_dict(), "lengths": lengths, "max_model_len": 2048,
                        "ramps": ramps})


def _hostile_loadtest(data: dict, text: str) -> dict:
    data = json.loads(json.dumps(data))
    for r in data["ramps"]:
        r["stopped"] = text                      # a server's own error message, quoted
        r["tool"] = text
        r["engine"] = {"host": text, "dtype_choice": {"dtype": text, "reason": text},
                       "probe": {"step_s": 0.1, "budget_step_s": 2.0}}
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=HOSTILE)
def test_the_load_test_markdown_keeps_what_servers_said_as_text(loadtest_data, text):
    md = loadtest_report.markdown(_hostile_loadtest(loadtest_data, text))
    assert markdown_problems(md) == []


@pytest.mark.parametrize("text", PIECES)
def test_the_load_test_html_keeps_what_servers_said_as_text(loadtest_data, text):
    page = loadtest_report.render_html(_hostile_loadtest(loadtest_data, text))
    assert html_problems(page, {"html", "head", "meta", "title", "style", "body", "h1", "h2", "ul", "li", "table",
                                "tr", "th", "td", "img", "p"}) == []
