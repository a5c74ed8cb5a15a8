import json

import pytest

from quantkit.errors import QuantkitError
from quantkit.evaluation.business import business_slices
from quantkit.evaluation.slices import DEFAULT_SUITE, eval_dir, load_suite, read_slice


def test_default_suite_is_shipped_with_provenance():
    slices = load_suite("default")
    assert [s.name for s in slices] == list(DEFAULT_SUITE)
    prov = json.loads((eval_dir() / "provenance.json").read_text())
    for s in slices:
        assert s.items and s.public
        assert prov[s.name] and all(p["file_sha256"] and p["licence"] for p in prov[s.name])
    langs = {s.name.rsplit("-", 1)[1] for s in slices}
    assert {"en", "zh"} <= langs
    kinds = {it["kind"] for s in slices for it in s.items}
    assert kinds == {"text", "mc", "extract", "code"}


def test_focus_spans_point_at_what_the_slice_is_about():
    nums = load_suite("numbers-en")[0].items[0]
    assert all(any(c.isdigit() for c in nums["text"][a:b]) for a, b in nums["focus"])
    names = load_suite("names-en")[0].items[0]
    assert all(names["text"][a].isupper() for a, b in names["focus"])


def test_unknown_slice_and_bad_lines_name_the_culprit(tmp_path):
    with pytest.raises(QuantkitError, match="--suite: unknown slice 'numbers-fr'"):
        load_suite("numbers-en,numbers-fr")
    p = tmp_path / "mine.jsonl"
    p.write_text('{"kind": "text", "text": "ok"}\n{"kind": "mc", "question": "q"}\n')
    with pytest.raises(QuantkitError, match=r"mine.jsonl:2: mc item lacks key 'choices'"):
        read_slice(p)
    p.write_text("{not json\n")
    with pytest.raises(QuantkitError, match=r"mine.jsonl:1: not JSON"):
        read_slice(p)


def test_business_slices_group_by_task_and_are_private(tmp_path):
    log = tmp_path / "log.jsonl"
    rows = [{"prompt": f"refund order {i}", "response": "ok", "task_type": "support"} for i in range(3)]
    rows += [{"text": "SELECT 1", "task": "sql"}]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    slices = business_slices(log)
    assert [(s.name, len(s.items), s.public) for s in slices] == [("business:sql", 1, False),
                                                                   ("business:support", 3, False)]
    log.write_text('{"other": 1}\n')
    with pytest.raises(QuantkitError, match=r"log.jsonl: no usable business rows \(missing_field 1"):
        business_slices(log)


def test_evaluation_text_is_disjoint_from_the_calibration_set():
    calib = eval_dir().parent / "calibration" / "default.jsonl"
    if not calib.exists():
        pytest.skip("no shipped calibration set")
    text = calib.read_text(encoding="utf-8")
    blob = json.dumps([json.loads(line) for line in text.splitlines() if line.strip()], ensure_ascii=False)
    for s in load_suite("default"):
        for it in s.items:
            probe = it.get("text") or it.get("question") or it.get("prompt")
            probe = probe.strip()[:80]
            if len(probe) >= 40:
                assert json.dumps(probe, ensure_ascii=False)[1:-1] not in blob, (s.name, it["id"])
