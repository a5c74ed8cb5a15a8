"""The user's task labels survive into the samples, the manifest and the coverage report."""

from __future__ import annotations

import json

import pytest

from quantkit.calibration import SamplerConfig, calibrate
from quantkit.calibration.task_types import user_labels


def _chat(user: str, reply: str) -> list[dict]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]


@pytest.fixture(scope="module")
def labelled(tmp_path_factory, real_units, tokenizer):
    """Labels the rules would rename (summarize, extract, Q&A) and unlabelled rows of those tasks."""
    en = real_units["en"]
    rows = []
    for i in range(40):
        rows.append({"messages": _chat(f"Summarize this: {en[i]}", en[i + 1]), "task": "summarize"})
        rows.append({"messages": _chat(f"Pull the names from: {en[i + 50]}", en[i + 51]), "task": "Extract"})
        rows.append({"messages": _chat(f"Q{i}: {en[i + 100]}", en[i + 101]), "task": "Q&A"})
    for i in range(20):  # unlabelled: the rules say summarisation / extraction
        rows.append({"messages": _chat(f"Please summarise the key points of {en[i + 200]}", "ok")})
        rows.append({"messages": _chat(f"Extract every date from {en[i + 300]}", "none")})
    folder = tmp_path_factory.mktemp("labels")
    log = folder / "log.jsonl"
    log.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return calibrate(log, tokenizer, SamplerConfig(num_samples=60, max_len=256, seed=0), out=folder / "out")


def test_manifest_and_samples_keep_the_users_labels(labelled):
    m = labelled.manifest
    names = {t["name"] for t in m["tasks"]}
    assert names == {"summarize", "Extract", "Q&A"}, names
    assert {c["task"] for c in m["cells"]} == names
    assert {s["task"] for s in labelled.samples} <= names
    # the unlabelled summarise/extract rows joined the user's labels, not new rule-named tasks
    rows = {t["name"]: t["distinct_rows"] for t in m["tasks"]}
    assert rows["summarize"] == 60 and rows["Extract"] == 60 and rows["Q&A"] == 40, rows


def test_reports_show_the_users_labels(labelled):
    md = (labelled.out / "report.md").read_text(encoding="utf-8")
    report = json.loads((labelled.out / "report.json").read_text(encoding="utf-8"))
    html = (labelled.out / "report.html").read_text(encoding="utf-8")
    for renamed in ("summarisation", "extraction", "qa_document"):
        assert renamed not in md and renamed not in html and renamed not in json.dumps(report)
    assert "| summarize |" in md and "| Extract |" in md
    assert "Q&amp;A" in html
    assert [t["name"] for t in report["tasks"]] == [t["name"] for t in labelled.manifest["tasks"]]


def test_labels_never_merge_two_user_tasks():
    # "qa" and "rag" both alias qa_document internally: the user's two tasks stay two
    got = user_labels(["qa", "rag", "RAG", None], [None, None, None, "qa_document"])
    assert got[:3] == ["qa", "rag", "rag"]
    assert got[3] == "rag"   # an inferred row joins the user's most frequent label for that task
