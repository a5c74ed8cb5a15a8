"""Acceptance item 3: the report renders and its figures match the manifest (checked
structurally: tables parsed from the HTML, embedded plot series, decodable PNGs)."""

from __future__ import annotations

import base64
import io
import json
from html.parser import HTMLParser

import pytest

from quantkit.calibration import calibrate
from quantkit.calibration.coverage_plots import figure_series


class _Doc(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables, self.images, self.data = {}, [], {}
        self._table = self._row = self._cell = None
        self._script = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(a.get("class"), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = ""
        elif tag == "img":
            self.images.append(a["src"])
        elif tag == "script" and a.get("class") == "figure-data":
            self._script = a["data-figure"]
            self.data[self._script] = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self._table.append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "script":
            self._script = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data
        if self._script is not None:
            self.data[self._script] += data


@pytest.fixture(scope="module")
def run(tmp_path_factory, default_rows, tokenizer):
    folder = tmp_path_factory.mktemp("report")
    log = folder / "log.jsonl"
    rows = default_rows[:400] + [{"messages": "oops"}]
    log.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) + "{bad\n")
    res = calibrate(log, tokenizer, out=folder / "out", num_samples=64, max_len=1024, seed=3)
    return res, folder / "out"


def test_html_tables_match_manifest(run):
    res, out = run
    m = res.manifest
    doc = _Doc()
    doc.feed((out / "report.html").read_text(encoding="utf-8"))
    cells = doc.tables["cells"][1:]
    assert [(r[0], r[1], int(r[2]), int(r[4]), int(r[6]), int(r[7])) for r in cells] == \
        [(c["task"], c["bucket"], c["traffic_rows"], c["distinct_rows"], c["target"], c["selected"])
         for c in m["cells"]]
    counts = dict(doc.tables["counts"][1:])
    assert counts["samples selected"] == str(m["counts"]["selected"]) == "64"
    assert counts["rows read"] == "402" and counts["malformed (skipped)"] == "2"
    assert {r[0]: int(r[1]) for r in doc.tables["malformed"][1:]} == {"bad_json": 1, "bad_messages": 1}
    assert [r[0] for r in doc.tables["tasks"][1:]] == [t["name"] for t in m["tasks"]]


def test_figures_are_pngs_of_the_manifest_series(run):
    import matplotlib.image as mpimg

    res, out = run
    m = res.manifest
    doc = _Doc()
    doc.feed((out / "report.html").read_text(encoding="utf-8"))
    assert {k: json.loads(v) for k, v in doc.data.items()} == figure_series(m)
    tasks = json.loads(doc.data["tasks"])
    assert tasks["sample"] == [round(100 * t["sample_share"], 4) for t in m["tasks"]]
    hist = json.loads(doc.data["lengths"])
    assert len(hist["labels"]) == len(m["length_histogram"]["edges"])
    assert sum(m["length_histogram"]["sample"]) == m["counts"]["selected"]
    assert len(doc.images) == 3
    for src in doc.images:
        assert src.startswith("data:image/png;base64,")
        img = mpimg.imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), format="png")
        assert img.shape[0] > 200 and img.shape[1] > 400


def test_json_and_markdown_carry_the_same_numbers(run):
    res, out = run
    rep = json.loads((out / "report.json").read_text())
    assert rep["cells"] == res.manifest["cells"] and rep["counts"] == res.manifest["counts"]
    md = (out / "report.md").read_text()
    for c in res.manifest["cells"]:
        assert f"| {c['task']} | {c['bucket']} | {c['traffic_rows']} |" in md


def test_reports_hold_no_calibration_text(run):
    res, out = run
    probes = [s["text"][-60:] for s in res.samples]
    for name in ("report.md", "report.html", "report.json", "manifest.json"):
        body = (out / name).read_text(encoding="utf-8")
        assert not any(p in body for p in probes), name


def test_markdown_report_escapes_user_task_names(run):
    """Task types come from the log's own labels: the real renderer keeps them text, one cell each."""
    from quantkit.calibration.report import report_markdown

    res, _ = run
    manifest = json.loads(json.dumps(res.manifest))
    evil = "<script>alert(1)</script>|`x`"
    manifest["tasks"][0]["name"] = evil
    manifest["task_source"]["source"] = {evil: 1}
    md = report_markdown(manifest)
    assert "<script>" not in md
    row = next(line for line in md.splitlines() if line.startswith("| &lt;script&gt;"))
    assert row.startswith("| &lt;script&gt;alert(1)&lt;/script&gt;\\|\\`x\\` |")
    assert row.replace("\\|", "").count("|") == 8   # the task table's 7 columns: still one cell each


def test_html_report_keeps_its_structure_whatever_a_task_label_holds(run):
    """A task label can hold anything: "<!--<script>" inside an embedded JSON block would put the
    parser in script data's escaped state and swallow the figures after it. Every figure stays one
    figure with its data readable as JSON."""
    from html.parser import HTMLParser

    from quantkit.calibration.report import report_html

    res, _ = run
    manifest = json.loads(json.dumps(res.manifest))
    evil = "<!--<script></script>&amp;"
    for t in manifest["tasks"]:
        t["name"] = evil + t["name"]
    manifest["task_source"]["source"] = {evil: 1}
    page = report_html(manifest)

    class Figures(HTMLParser):
        def __init__(self):
            super().__init__()
            self.figures, self.data, self._in = 0, [], False

        def handle_starttag(self, tag, attrs):
            self.figures += tag == "figure"
            self._in = tag == "script"

        def handle_endtag(self, tag):
            self._in = False if tag == "script" else self._in

        def handle_data(self, data):
            if self._in:
                self.data.append(data)

    parser = Figures()
    parser.feed(page)
    assert parser.figures == page.count('<figure id="figure-') >= 2
    parsed = [json.loads(d) for d in parser.data]
    assert len(parsed) == parser.figures and evil in json.dumps(parsed, ensure_ascii=False)
    # what a browser's HTML5 parser reacts to inside script data (Python's parser does not model it)
    assert not [d for d in parser.data if "<!--" in d or "<script" in d.lower() or "</" in d]
