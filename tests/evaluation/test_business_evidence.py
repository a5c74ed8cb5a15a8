"""Business slices sized by evidence: rows are drawn until the task holds the scored-token
budget, up to a row cap; the report says which stop applied; a slice short of the budget cannot
decide the verdict alone, in either direction."""
from __future__ import annotations

import json

import pytest
import typer
from test_business import chatml_tokenizer
from tiny import FAST, fake_quant_linears, tiny_model
from typer.testing import CliRunner

from quantkit.errors import QuantkitError
from quantkit.evaluation import evaluate
from quantkit.evaluation.business import STOP_BUDGET, STOP_EXHAUSTED, STOP_ROW_CAP
from quantkit.cli.eval_command import eval_command
from quantkit.workflows.evaluate import evaluate_paths
from quantkit.evaluation.eval_section import check_eval_section
from quantkit.evaluation.slices import SuiteOptions
from quantkit.evaluation.verdict import GO, NOGO, REVIEW, decide, insufficient

WORDS = "river bridge mayor family bank noon volunteer sandbag water road school market".split()


@pytest.fixture(scope="module")
def chat_tok():
    return chatml_tokenizer()


@pytest.fixture(scope="module")
def model(chat_tok):
    return tiny_model(len(chat_tok))


def _row(task: str, i: int, reply_words: int) -> dict:
    ask = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(6))
    reply = " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(reply_words))
    return {"task": task, "messages": [{"role": "user", "content": f"Row {i}: {ask}?"},
                                       {"role": "assistant", "content": reply}]}


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """Three tasks: long replies (the budget is met in a few rows), one-word replies in plenty
    (the row cap stops them short of it), and a task of four rows (the log runs out)."""
    rows = [_row("long", i, 40) for i in range(20)] + [_row("short", i, 1) for i in range(60)]
    rows += [_row("few", i, 3) for i in range(4)]
    path = tmp_path_factory.mktemp("evidence") / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


OPTS = SuiteOptions(**{**FAST.__dict__, "gen_prompts": 0, "business_rows": 12, "business_scored_tokens": 96})


def _evaluate(model, cand, tok, log, **fields):
    return evaluate(model, cand, tok, suite=[], max_len=256, calibration_log=log, progress=False,
                    **{"options": OPTS, **fields})


def test_each_slice_records_its_rows_its_tokens_and_which_stop_applied(model, chat_tok, log):
    r = _evaluate(model, model, chat_tok, log)
    tasks = r.meta["business"]["tasks"]
    assert r.meta["business"]["scored_tokens_min"] == 96
    assert {t: (c["stop"], c["evidence"]) for t, c in tasks.items()} == {
        "long": (STOP_BUDGET, "sufficient"), "short": (STOP_ROW_CAP, "insufficient"),
        "few": (STOP_EXHAUSTED, "insufficient")}
    for t, c in tasks.items():
        assert c["scored_tokens"] == r.slices[f"business:{t}"]["tokens"]
        assert c["evaluated"] == r.slices[f"business:{t}"]["rows"]
    assert tasks["long"]["scored_tokens"] >= 96 and tasks["long"]["evaluated"] < 12   # stopped by the budget
    assert tasks["short"]["evaluated"] == 12 and tasks["few"]["evaluated"] == 4
    md = r.save(log.parent / "eval", overwrite=True) / "report.md"
    assert "row cap hit" in md.read_text() and "insufficient evidence" in md.read_text()


def test_an_insufficient_slice_cannot_make_the_verdict_go(model, chat_tok, log):
    # the candidate is the baseline: every measure is perfect, yet two slices are too thin to say so
    r = _evaluate(model, model, chat_tok, log)
    assert not [x for x in r.verdict.reasons if x.measure != "scored_tokens"]
    assert r.decision == REVIEW
    assert r.verdict.slices == {"business:few": REVIEW, "business:long": GO, "business:short": REVIEW}
    n = r.slices["business:short"]["tokens"]
    assert any(x.text().startswith(f"business:short: insufficient evidence: {n} scored tokens < 96")
               for x in r.verdict.reasons)
    assert r.verdict.evidence["business:short"] == {"scored_tokens": n, "minimum": 96, "measured_level": GO}
    # the same rows with a budget they meet: GO
    enough = _evaluate(model, model, chat_tok, log, options=SuiteOptions(**{**OPTS.__dict__, "business_scored_tokens": 8}))
    assert enough.decision == GO and not enough.verdict.reasons


def test_an_insufficient_slice_cannot_make_the_verdict_no_go(model, chat_tok, log):
    broken = fake_quant_linears(model, 2)
    short = log.parent / "short.jsonl"      # the one-word task alone: the row cap leaves it thin
    short.write_text("".join(line + "\n" for line in log.read_text().splitlines() if '"short"' in line))
    r = _evaluate(model, broken, chat_tok, short)
    said = [x for x in r.verdict.reasons if x.slice == "business:short"]
    assert r.verdict.evidence["business:short"]["measured_level"] == NOGO
    assert {x.level for x in said} == {NOGO, REVIEW} and any(x.measure == "scored_tokens" for x in said)
    assert r.verdict.slices["business:short"] == REVIEW and r.decision == REVIEW
    # the same breach on enough evidence decides: NO-GO
    enough = _evaluate(model, broken, chat_tok, short, options=SuiteOptions(**{**OPTS.__dict__, "business_scored_tokens": 8}))
    assert enough.verdict.slices["business:short"] == NOGO and enough.decision == NOGO


def test_the_rule_in_the_verdict_alone():
    values = {"business:a": {"kl_mean": 0.5, "tokens": 160}, "business:b": {"kl_mean": 0.001, "tokens": 160},
              "numbers-en": {"kl_mean": 0.001, "tokens": 2000}}
    thin = insufficient(values, ["business:a", "business:b"], 1024)
    assert thin == {"business:a": (160, 1024), "business:b": (160, 1024)}
    v = decide(values, thin=thin)
    assert v.decision == REVIEW and v.slices == {"business:a": REVIEW, "business:b": REVIEW, "numbers-en": GO}
    assert [(x.slice, x.level) for x in v.reasons] == [("business:a", NOGO), ("business:a", REVIEW),
                                                        ("business:b", REVIEW)]
    assert v.reasons[2].text().startswith("business:b: insufficient evidence: 160 scored tokens < 1024")
    # a public slice that breaches still decides, whatever the thin slices say
    values["numbers-en"]["kl_mean"] = 0.5
    assert decide(values, thin=thin).decision == NOGO
    # a slice that does not gate stays information, thin or not
    assert decide({"business:a": {"kl_mean": 0.001, "tokens": 1}}, thin={"business:a": (1, 1024)},
                  not_gated={"business:a": "not gated"}).decision == GO


@pytest.mark.parametrize("options, message", [
    ({"business_rows": 0}, "eval.options.business_rows: expected a positive integer, got 0"),
    ({"business_scored_tokens": None}, "eval.options.business_scored_tokens"),
    ({"business_scored_tokens": -5}, "eval.options.business_scored_tokens: expected a positive integer, got -5"),
])
def test_bad_sizes_in_a_recipe_are_one_line(options, message):
    with pytest.raises(QuantkitError, match="^" + message.replace(".", r"\.")) as e:
        check_eval_section({"options": options})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("flag, field", [("--business-rows", "business_rows"),
                                         ("--business-scored-tokens", "business_scored_tokens")])
def test_bad_size_flags_are_one_line_exit_2(tmp_path, flag, field):
    with pytest.raises(QuantkitError, match=f"^{flag}: expected a positive integer, got 0$"):
        evaluate_paths(None, tmp_path / "missing", **{field: 0})
    app = typer.Typer()
    app.command()(eval_command)
    r = CliRunner().invoke(app, ["--candidate", str(tmp_path / "missing"), "--out", str(tmp_path / "out"), flag, "0"])
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {flag}: expected a positive integer, got 0"
    assert not (tmp_path / "out").exists()


def test_the_flags_reach_the_suite_options():
    from quantkit.workflows.evaluate import PathsOptions, business_flags

    got = business_flags(SuiteOptions(), PathsOptions(business_rows=300, business_scored_tokens=2048))
    assert (got.business_rows, got.business_scored_tokens) == (300, 2048)
    assert business_flags(SuiteOptions(business_rows=7), PathsOptions()).business_rows == 7   # the recipe's stays
