"""Whatever a user's files or a server say, what quantkit writes keeps it as text: the model card,
the load test's and the calibration's reports in Markdown and HTML. Hostile strings (Markdown
headings, links and images, raw HTML, a ``javascript:`` scheme, script-data openers, table pipes,
line breaks, backticks) go into every field a user or a server controls; the documents are parsed
and must hold no element, link or image that came from them."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings

from quantkit.loadtest import loadtest_report
from quantkit.loadtest.ramp import RampPolicy
from quantkit.loadtest.slo import parse_slo
from quantkit.workflows.loadtest import Ramp, length_model, report_data, run_ramp
from quantkit.workflows.model_card import CardFacts, render

sys.path.insert(0, str(Path(__file__).parents[1] / "loadtest"))
from test_ramp_loop import _stream, modelled_server  # noqa: E402

from hostile_text import HOSTILE, PIECES, html_problems, markdown_problems  # noqa: E402


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
