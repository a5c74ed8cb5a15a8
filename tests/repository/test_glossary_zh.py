"""The Chinese reports are written from one glossary (docs/zh/glossary.md), which the Chinese guides
use too: every message of the reports' word catalogues whose English holds a glossary term holds the
term's Chinese; no Chinese text, rendered report or guide uses a rendering the glossary rejects; and
a rendered Chinese report holds no ASCII word outside code, names (slices, measures, JSON keys, the
model's modules), levels, flags and units. The reports are the main job's, built from its recorded
result (tests/recorded_report.py): the evaluation's report.md and report.html, the model card, and
the calibration coverage report."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest
from browser import untranslated
from recorded_report import NO_KERNEL_FORMAT, main_job_card, main_job_data

from quantkit.calibration.report import WORDS as CALIBRATION_WORDS
from quantkit.calibration.report import report_markdown
from quantkit.evaluation.measures import table_columns
from quantkit.evaluation.report import integrity_grid, markdown, render_html
from quantkit.evaluation.report.words import WORDS as REPORT_WORDS
from quantkit.workflows.model_card import TEXTS

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "docs" / "zh" / "glossary.md"
FIELD = re.compile(r"\{[^}]*\}")
CODE = re.compile(r"(`+).+?\1(?!`)|\]\([^)]*\)", re.S)   # code (fenced by as many backticks), a link's target
FLAG = re.compile(r"--[a-z][a-z0-9-]*")
# what stays as written in a Chinese report besides the data's own names: the product, symbols,
# units, formats, file names and the glossary's untranslated terms
SYMBOLS = {"quantkit", "KL", "SQNR", "dB", "GiB", "MiB", "nats", "GPU", "lm-eval", "top-1", "README.md", "kv",
           "max_position_embeddings", "eval.languages", "eval.max_len", "compressed-tensors", "sha256", "jsonl",
           "report.html", "num_samples", "max_len", "min_per_cell", "en", "zh", "traffic", "vllm", "transformers",
           "torch", "triton", "max_model_len", NO_KERNEL_FORMAT}


@dataclass(frozen=True)
class Term:
    en: str
    zh: str
    avoid: tuple[str, ...]


def glossary() -> list[Term]:
    """The glossary's rows, longest English term first (a phrase is matched before its words)."""
    rows = [line for line in GLOSSARY.read_text(encoding="utf-8").splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| English | 中文 | 不要写成 |"), rows[0]
    terms = []
    for row in rows[1:]:
        en, zh, avoid = (c.strip() for c in row.strip("|").split("|")[:3])
        terms.append(Term(en, zh, tuple(a for a in re.split(r"[、，,]\s*", avoid) if a)))
    return sorted(terms, key=lambda t: -len(t.en))


def _card_pairs() -> list[tuple[str, str, str]]:
    """(where, English, Chinese) of the model card's words, field by field (a phrase table by key:
    the Chinese card names strategies and types the English one leaves as they are)."""
    out = []
    for f in dataclasses.fields(TEXTS["en"]):
        en, zh = getattr(TEXTS["en"], f.name), getattr(TEXTS["zh"], f.name)
        if isinstance(en, dict):
            out += [(f"card:{f.name}.{k}", en[k], zh[k]) for k in en if k in zh]
        elif isinstance(en, tuple):
            out += [(f"card:{f.name}.{i}", e, z) for i, (e, z) in enumerate(zip(en, zh))]
        else:
            out.append((f"card:{f.name}", en, zh))
    return out


def messages() -> list[tuple[str, str, str]]:
    """(where, English, Chinese) of every message the Chinese reports are written from."""
    out = [(f"report:{k}", REPORT_WORDS.text("en", k), REPORT_WORDS.text("zh", k)) for k in REPORT_WORDS]
    out += [(f"calibration:{k}", CALIBRATION_WORDS.text("en", k), CALIBRATION_WORDS.text("zh", k))
            for k in CALIBRATION_WORDS]
    return out + _card_pairs()


def term_problems(pairs: list[tuple[str, str, str]], terms: list[Term]) -> list[str]:
    """Where a message's English holds a glossary term and its Chinese not the term's Chinese."""
    problems = []
    for where, en, zh in pairs:
        rest = FIELD.sub(" ", en)
        for t in terms:
            words = r"(?:s|es)?\s+".join(re.escape(x) for x in t.en.split())   # "gates the decision" too
            pattern = re.compile(rf"(?<![\w-]){words}(s|es)?(?![\w-])", re.I)
            if pattern.search(rest):
                if t.zh not in zh:
                    problems.append(f"{where}: {t.en!r} -> {t.zh!r} not in {zh!r}")
                rest = pattern.sub(" ", rest)   # a phrase's words are not terms of their own
    return problems


class _Text(HTMLParser):
    """A page's text outside <code>, <pre> and <style>."""

    def __init__(self):
        super().__init__()
        self.parts, self._skip = [], 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("code", "pre", "style", "title")
        if tag != "wbr":   # a name broken after its underscores stays one word
            self.parts.append(" ")

    def handle_endtag(self, tag):
        self._skip -= tag in ("code", "pre", "style", "title")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def _manifest() -> dict:
    """A coverage manifest as calibrate writes it, with one warning of each kind."""
    bucket = {"traffic_rows": 3, "traffic_share": 0.5, "distinct_rows": 2, "distinct_share": 0.5, "selected": 1,
              "sample_share": 0.5}
    return {"source": {"name": "log.jsonl", "format": "jsonl", "sha256": "0" * 64},
            "tokenizer": {"name_or_path": "smollm2"},
            "config": {"policy": "traffic", "seed": 0, "num_samples": 128, "max_len": 2048, "min_per_cell": 1},
            "task_source": {"source": {"field": 40, "inferred": 12}, "sample": {"field": 30}},
            "languages": {"source": {"en": 30, "zh": 22}, "sample": {"en": 20}},
            "counts": {k: 1 for k in ("rows_read", "malformed", "valid", "duplicates_exact", "dropped_too_long",
                                      "pool", "duplicates_near", "selected", "truncated_source",
                                      "truncated_selected", "tokens_selected")},
            "malformed": {"bad_json": {"count": 1, "first_lines": [3]}},
            "tasks": [{"name": "chat", **bucket}, {"name": "code", **bucket}], "buckets": [{"name": "1-64", **bucket}],
            "cells": [{"task": "chat", "bucket": "1-64", "target": 2, **bucket}],
            "length_histogram": {"edges": [64, 128], "traffic": [1, 2], "distinct": [1, 1], "sample": [1, 0]},
            "task_coverage": {"task_types": 1, "log_task_types": 2, "effective_task_types": 1.0, "narrow_below": 2.0},
            "warnings": ["narrow calibration set: the sample covers 1 task type (chat 30), 1.00 effective (< 2); "
                         "calibrated on one kind of text, a low-bit model can lose quality on every other kind it "
                         "serves: add traffic of its other tasks, and check the verdict on their slices (--calib)",
                         "cell chat x 1-64: only 2 distinct rows (< 8); collect more traffic of this kind",
                         "cell chat x 65-128: all 2 distinct rows drawn, its traffic share asked for 9 (its "
                         "requests repeat); the rest went to other cells",
                         "cell code x 1-64: not represented (num_samples too small for all cells)",
                         "selected 40 samples, fewer than the 128 asked: the log has no more distinct rows"]}


@pytest.fixture(scope="module")
def chinese() -> dict[str, str]:
    """The Chinese reports' text a reader sees outside code: name -> text."""
    data = main_job_data("zh")
    card = main_job_card(data, "zh").split("\n---\n", 1)[1]
    page = _Text()
    page.feed(render_html(data, {}, "zh"))
    return {"report.md": CODE.sub(" ", markdown(data, "zh")), "report.html": "".join(page.parts),
            "card": CODE.sub(" ", card), "calibration report.md": CODE.sub(" ", report_markdown(_manifest(), "zh"))}


def test_the_glossary_is_read_whole():
    terms = glossary()
    assert len(terms) > 30 and len({t.en for t in terms}) == len(terms)
    assert {("token", "token"), ("slice", "切片"), ("limit", "限值"), ("level", "级别")} <= {(t.en, t.zh) for t in terms}


def test_every_message_uses_the_glossarys_terms():
    pairs = messages()
    assert len(pairs) > 200
    assert term_problems(pairs, glossary()) == []
    # the check is not blind: a message with another rendering of a term is found
    planted = [("x", "Reasons per slice: the limit", "各片的原因：界限")]
    assert term_problems(planted, glossary()) == ["x: 'slice' -> '切片' not in '各片的原因：界限'",
                                                  "x: 'limit' -> '限值' not in '各片的原因：界限'"]


def test_no_chinese_text_uses_a_rejected_rendering(chinese):
    avoided = {a: t.en for t in glossary() for a in t.avoid}
    assert {"词元", "检查点", "假定等级", "自助抽样"} <= set(avoided)
    texts = {where: zh for where, _, zh in messages()} | chinese
    texts |= {f"docs/zh/{p.name}": p.read_text(encoding="utf-8") for p in sorted(GLOSSARY.parent.glob("*.md"))
              if p != GLOSSARY}
    found = [f"{where}: {a} (the glossary: {avoided[a]})" for where, text in texts.items() for a in avoided if a in text]
    assert found == []


def test_a_chinese_report_holds_no_ascii_word_outside_code_names_and_units(chinese):
    data = main_job_data("zh")
    names = set(data["slices"]) | set(data["thresholds"]) | {c for c, _, _ in table_columns()}
    names |= set(integrity_grid(data["integrity"])[1]) | set(data["footprint"]) | {"NO-GO", "REVIEW", "GO"}
    names |= {"id", "worst_token_kl", "token", "f1_base", "f1_cand"}   # a worst example's keys that are names
    names |= {v for v in data["footprint"].values() if isinstance(v, str)}          # dtype names: int4, fp16
    names |= {t.zh for t in glossary() if re.fullmatch(r"[\x00-\x7f]+", t.zh)} | SYMBOLS
    manifest = _manifest()                                  # the user's task labels, the reader's reason keys
    names |= {x["name"] for x in manifest["tasks"]} | set(manifest["malformed"])
    for where, text in chinese.items():
        assert untranslated([FLAG.sub(" ", text)], names) == [], where
    # the same check finds the English report's words
    english = CODE.sub(" ", markdown(main_job_data("en"), "en"))
    assert {"Reasons", "over", "Baseline"} <= set(untranslated([FLAG.sub(" ", english)], names))


def test_chinese_figures_are_rounded_as_the_english_ones(chinese):
    data = main_job_data("zh")
    for r in data["verdict"]["reasons"]:    # the verdict's English text prints four significant digits
        figures = re.search(rf"{r['measure']} (\S+) [<>] (\S+)", r["text"]).groups()
        assert f"{r['slice']}：{r['measure']} {figures[0]} " in chinese["report.md"], r["text"]
    reasons = {lang: markdown(main_job_data(lang), lang).split("\n## ")[1] for lang in ("en", "zh")}
    numbers = {lang: re.findall(r"\d[\d.e-]*", text) for lang, text in reasons.items()}
    assert numbers["zh"] == numbers["en"] and len(numbers["en"]) > 60     # the same figures, digit for digit
    # "越过限值", never "超出", for a value below its limit
    low = next(r for r in data["verdict"]["reasons"] if r["value"] < r["limit"])
    line = next(x for x in chinese["report.md"].splitlines() if f"{low['measure']} " in x and low["slice"] in x)
    assert "越过限值" in line and "超出" not in line


def test_no_space_is_left_between_chinese_words():
    """Joined strings leave no space between Chinese words ("（来自 基线的模型卡"): a space stands only
    between Chinese and a Latin word, number or code."""
    data = main_job_data("zh")
    texts = {"report.md": markdown(data, "zh"), "card": main_job_card(data, "zh").split("\n---\n", 1)[1],
             "calibration report.md": report_markdown(_manifest(), "zh")}
    between = re.compile(r"[\u4e00-\u9fff（），。：；、] +[\u4e00-\u9fff（），。：；、]")
    found = [f"{where}: {line}" for where, text in texts.items() for line in CODE.sub("code", text).splitlines()
             if between.search(line)]
    assert found == []
    assert between.search("参与判定的语言：en（来自 基线的模型卡 README.md）")   # the check sees one
