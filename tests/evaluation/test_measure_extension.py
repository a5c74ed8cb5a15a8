"""A measure added as one new module reaches the verdict, report.json, report.md and
report.html with no other file changed, and leaves the registry as it found it."""
import importlib.util
import json
import sys

import pytest
from report_html import parse
from tiny import FAST, TINY_THRESHOLDS, _take, fake_quant_linears

from quantkit.evaluation import evaluate, load_suite
from quantkit.evaluation.measures import MEASURES
from quantkit.evaluation.verdict import DEFAULT_LIMITS, Thresholds
from quantkit.common.markdown_text import md_text

TOY = '''
"""The largest mean KL of any one scored row: a measure outside the shipped ones."""
from quantkit.evaluation.backends.base import ScoredSlice
from quantkit.evaluation.measures.base import measure


@measure(name="worst_row_kl", higher_is_better=False, review=0.0, nogo=None, title="worst row KL",
         evidence="none: any KL on a row is reviewed", applies=lambda s: s.forced is not None)
def worst_row_kl(s: ScoredSlice) -> float:
    return max(r.kl_sum / r.tokens for r in s.forced.items if r.tokens)
'''


@pytest.fixture
def toy_measure(tmp_path):
    """Import TOY as a module of its own, as a user's file would be; afterwards restore the
    registry and forget the module."""
    saved = dict(MEASURES)
    path = tmp_path / "toy_measure.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("toy_measure", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["toy_measure"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        MEASURES.clear()
        MEASURES.update(saved)
        sys.modules.pop("toy_measure", None)


def test_a_new_measure_reaches_verdict_and_every_report(toy_measure, base, tok, tmp_path):
    suite = [_take(s, 2) for s in load_suite("numbers-en,knowledge-en")]
    cand = fake_quant_linears(base, 4, group=32)
    r = evaluate(base, cand, tok, suite=suite, max_len=256, thresholds=TINY_THRESHOLDS, options=FAST, progress=False)
    out = r.save(tmp_path / "eval")

    value = r.slices["numbers-en"]["worst_row_kl"]
    assert value > 0 and "worst_row_kl" not in r.slices["knowledge-en"]   # no texts there: it does not apply
    [reason] = [x for x in r.verdict.reasons if x.measure == "worst_row_kl"]
    assert (reason.slice, reason.level, reason.limit) == ("numbers-en", "REVIEW", 0.0)
    assert r.verdict.slices["numbers-en"] != "GO"

    data = json.loads((out / "report.json").read_text())
    assert data["slices"]["numbers-en"]["worst_row_kl"] == pytest.approx(value, rel=1e-5)
    assert data["thresholds"]["worst_row_kl"] == {"review": 0.0, "nogo": None, "higher_is_better": False}
    [said] = [x for x in data["verdict"]["reasons"] if x["measure"] == "worst_row_kl"]

    md = (out / "report.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| slice | language |"))
    assert header.rstrip(" |").endswith("worst row KL")
    assert "| worst_row_kl | 0 | – | lower |" in md
    assert said["text"].startswith("numbers-en: worst_row_kl ") and md_text(said["text"]) in md

    page = parse((out / "report.html").read_text())
    assert page.cells["slices.numbers-en.worst_row_kl"] == format(data["slices"]["numbers-en"]["worst_row_kl"], ".6g")
    assert ("worst row KL", None) in [tuple(c) for c in page.tables["slices"][0]]
    assert page.cells["thresholds.worst_row_kl.review"] == "0"


def test_the_registry_is_as_shipped_after_the_toy_measure():
    assert "worst_row_kl" not in MEASURES and "worst_row_kl" not in DEFAULT_LIMITS
    assert "worst_row_kl" not in Thresholds().limits
    assert "kl_mean" in MEASURES and "toy_measure" not in sys.modules
