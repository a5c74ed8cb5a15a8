"""Business slices: rows held by the calibration sample are left out and counted; chat rows are
rendered through the chat template and only their assistant turns are scored."""
from __future__ import annotations

import json

import pytest
import torch
from tiny import FAST, fake_quant_linears, tiny_model, tiny_tokenizer

from quantkit.calibration import SamplerConfig, calibrate
from quantkit.errors import QuantkitError
from quantkit.evaluation import evaluate, load_suite
from quantkit.evaluation.business import business_item, read_business, render_turns, sample_hashes
from quantkit.evaluation.divergence import token_stats
from quantkit.evaluation.forced import ForcedRequest, encode_text, run_forced
from quantkit.evaluation.causal_lm import pad_id
from quantkit.evaluation.slices import SuiteOptions

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ("the river rose three metres before the bridge closed and the mayor asked every family "
         "near the bank to leave by noon while volunteers filled sandbags").split()


def chatml_tokenizer():
    """The tiny tokenizer with a ChatML template whose turn markers are special tokens."""
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="module")
def chat_tok():
    return chatml_tokenizer()


def _words(i: int, n: int) -> str:
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(n)) + f" {i}"


def _conversation(i: int) -> list[dict]:
    return [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": f"Question {i}: {_words(i, 9)}?"},
            {"role": "assistant", "content": f"Answer {i}: {_words(i + 3, 6)}."},
            {"role": "user", "content": f"And then {i}?"},
            {"role": "assistant", "content": f"Then {_words(i + 7, 5)}."}]


@pytest.fixture(scope="module")
def log_and_sample(tmp_path_factory, chat_tok):
    folder = tmp_path_factory.mktemp("business")
    rows = [{"id": f"r{i}", "messages": _conversation(i), "task": "support"} for i in range(40)]
    log = folder / "traffic.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the sampler renders with a tokenizer without a template: content hashes do not depend on it
    calib = calibrate(log, tiny_tokenizer(), SamplerConfig(num_samples=10, max_len=512, seed=4), out=folder / "calib")
    sampled = {s["source_line"] for s in calib.samples}
    # a sampled row again, under another id and with other spacing and case: the same text
    first = sorted(sampled)[0]
    again = json.loads(log.read_text().splitlines()[first - 1])
    again["id"] = "another-id"
    again["messages"][1]["content"] = "  " + again["messages"][1]["content"].upper() + "\n"
    with log.open("a") as fh:
        fh.write(json.dumps(again) + "\n")
    return log, folder / "calib", sampled


def test_a_row_in_the_calibration_sample_is_excluded_and_counted(log_and_sample, chat_tok):
    log, calib, sampled = log_and_sample
    held, _ = sample_hashes(calib)
    assert len(held) == 10
    got = read_business(log, chat_tok, rows_per_task=100, calibration_sample=calib)
    [sl] = got.slices
    used = {int(it["id"].split("-")[1]) for it in sl.items}
    assert not used & sampled and len(used) == 40 - 10          # every other row, none of the sample
    counts = got.summary["tasks"]["support"]
    assert counts["rows"] == 41 and counts["in_calibration"] == 11 and counts["repeats"] == 0
    assert got.summary["checked_against"]["same_source"] is False   # the log grew after sampling
    unchecked = read_business(log, chat_tok, rows_per_task=100)
    assert unchecked.summary["tasks"]["support"]["repeats"] == 1   # the planted copy, once
    assert len(unchecked.slices[0].items) == 40


def test_excluded_rows_reach_the_report(log_and_sample, chat_tok, tmp_path):
    log, calib, _ = log_and_sample
    base = tiny_model(len(chat_tok))
    opts = SuiteOptions(**{**FAST.__dict__, "business_rows": 6, "business_scored_tokens": 10**6})
    suite = load_suite("numbers-en")
    suite[0].items = suite[0].items[:2]
    r = evaluate(base, fake_quant_linears(base, 4), chat_tok, suite=suite, max_len=256, options=opts,
                 calibration_log=log, calibration_sample=calib, progress=False)
    b = r.meta["business"]["tasks"]["support"]
    assert (b["in_calibration"], b["evaluated"], b["without_reply"]) == (11, 6, 0)
    assert b["scored_tokens"] == r.slices["business:support"]["tokens"] > 0
    md = r.save(tmp_path / "eval") / "report.md"
    assert "## Business rows" in md.read_text() and "| support | 41 | 11 | 0 | 6 | 0 |" in md.read_text()
    assert not any("not checked against the calibration sample" in w for w in r.warnings)
    kl, (lo, hi) = r.slices["business:support"]["kl_mean"], r.slices["business:support"]["kl_mean_ci"]
    assert lo <= kl <= hi and lo < hi
    # a limit inside the interval: the verdict says the slice is within noise of it, and why
    at = evaluate(base, fake_quant_linears(base, 4), chat_tok, suite=suite, max_len=256, options=opts,
                  calibration_log=log, calibration_sample=calib, progress=False,
                  thresholds={"kl_mean": {"review": (lo + hi) / 2, "nogo": None}})
    # (greedy agreement over a handful of prompts may sit within noise of its own limits too)
    noise = [(n["slice"], n["measure"]) for n in at.verdict.noise]
    assert [s for s, m in noise if m == "kl_mean"] == ["business:support"]
    assert {m for _, m in noise} <= {"kl_mean", "gen_agreement"}
    md = at.save(tmp_path / "eval2") / "report.md"
    assert "## Within noise of a limit" in md.read_text() and "holds its REVIEW limit" in md.read_text()


def test_a_manifest_without_hashes_is_one_line(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "quantkit-calibration", "version": 1}))
    with pytest.raises(QuantkitError, match=r"^--calib-sample: .*manifest.json: no sample_content hashes"):
        sample_hashes(tmp_path)


def test_chat_rows_score_only_the_assistant_tokens(chat_tok):
    messages = _conversation(5)
    text, spans, reply, prompt = render_turns(chat_tok, messages)
    assert text == chat_tok.apply_chat_template(messages, tokenize=False) and reply
    # each assistant turn as the template writes it: the reply and the token closing the turn
    turns = [f"{m['content']}<|im_end|>" for m in messages if m["role"] == "assistant"]
    assert [text[a:b] for a, b in spans] == turns
    assert prompt == chat_tok.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    item = {"id": "x", "kind": "text", "text": text, "score": spans}
    e = encode_text(chat_tok, item, 10_000)
    assert chat_tok.decode([i for i, s in zip(e.ids, e.scored) if s]) == "".join(turns)
    assert 0 < sum(e.scored) < len(e.ids) // 2

    base = tiny_model(len(chat_tok))
    cand = fake_quant_linears(base, 3)
    [st] = run_forced(base, cand, [e], ForcedRequest(512, 4096), pad_id(chat_tok)).items
    with torch.no_grad():   # the same measure by hand: every position, then the assistant ones
        ids = torch.tensor([e.ids])
        s = token_stats(base(ids).logits[0, :-1], cand(ids).logits[0, :-1], ids[0, 1:])
    keep = torch.tensor(e.scored[1:])
    assert st.tokens == int(keep.sum())
    assert st.kl_sum == pytest.approx(float(s["kl"][keep].sum()), rel=1e-4)
    assert st.nll_base == pytest.approx(float(s["nll_base"][keep].sum()), rel=1e-4)
    assert st.kl_sum < float(s["kl"].sum())   # the context's tokens were there, and not counted
    assert e.scored[st.worst_pos]


def test_a_long_row_keeps_the_window_ending_at_its_reply(chat_tok):
    messages = [{"role": "user", "content": " ".join(_words(i, 12) for i in range(30))},
                {"role": "assistant", "content": "Short reply."}]
    item = business_item(type("Row", (), {"line": 1, "shape": "chat"})(), {"messages": messages}, chat_tok)
    e = encode_text(chat_tok, item, 64)
    assert len(e.ids) == 64 and e.scored[-1] and sum(e.scored) > 0
    assert chat_tok.decode([i for i, s in zip(e.ids, e.scored) if s]) == "Short reply.<|im_end|>"


def test_rows_without_a_reply_score_their_turns_and_prompt_rows_their_completion(chat_tok, tmp_path):
    log = tmp_path / "log.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"Translate: {_words(i, 8)}"}], "task": "translate"}
            for i in range(3)]
    rows += [{"prompt": f"Q: {_words(i, 5)}\nA:", "response": f" {_words(i + 1, 4)}", "task_type": "qa"}
             for i in range(2)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_business(log, chat_tok)
    by = {s.name: s for s in got.slices}
    assert set(by) == {"business:translate", "business:qa"}
    t = by["business:translate"].items[0]
    assert not t["reply"] and [t["text"][a:b] for a, b in t["score"]] == [rows[0]["messages"][0]["content"]]
    assert t["gen_prompt"].endswith("<|im_start|>assistant\n")
    q = by["business:qa"].items[0]
    assert q["reply"] and [q["text"][a:b] for a, b in q["score"]] == [rows[3]["response"]]
    assert got.summary["tasks"]["translate"]["without_reply"] == 3


def test_generation_starts_from_the_rows_own_prompt_cut_to_its_last_tokens(chat_tok):
    from quantkit.evaluation.slice_scoring import generation_prompts

    messages = [{"role": "user", "content": " ".join(_words(i, 12) for i in range(12))},
                {"role": "assistant", "content": "Short reply."}]
    item = business_item(type("Row", (), {"line": 1, "shape": "chat"})(), {"messages": messages}, chat_tok)
    e = encode_text(chat_tok, item, 1024)
    [prompt] = generation_prompts(chat_tok, [item], [e], 32, 40)
    whole = chat_tok(item["gen_prompt"])["input_ids"]
    assert len(whole) > 40 and prompt == whole[-40:]
    assert chat_tok.decode(prompt).endswith("<|im_start|>assistant\n")   # the reply is what comes next


def test_a_checkpoint_log_of_a_drawn_set_excludes_the_same_rows(log_and_sample, chat_tok, tmp_path):
    # what `quantkit convert --calib LOG` keeps: the on-the-fly draw's hashes, in quantization_log.json
    from quantkit.calibration import load_calibration
    log, calib, sampled = log_and_sample
    record: dict = {}
    ids = load_calibration(log, tiny_tokenizer(), num_samples=10, max_seq_len=512, seed=4, record=record)
    assert len(ids) == 10 and record["source"]["name"] == "traffic.jsonl"
    held_saved, _ = sample_hashes(calib)
    assert set(record["sample_content"]["selected"]) == held_saved   # the same draw as the saved one
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "quantization_log.json").write_text(json.dumps(
        {"quantkit_version": "x", "calibration": {"num_samples": 10, **record}}))
    held, check = sample_hashes(ckpt)
    assert held == held_saved and check["manifest"].endswith("quantization_log.json")
    got = read_business(log, chat_tok, rows_per_task=100, calibration_sample=ckpt)
    assert got.summary["tasks"]["support"]["in_calibration"] == 11   # the 10 drawn rows and the re-spaced copy
    # a sampler folder passed as the source records its saved set
    again: dict = {}
    load_calibration(calib, tiny_tokenizer(), num_samples=10, max_seq_len=512, record=again)
    assert set(again["sample_content"]["selected"]) == held_saved


def test_a_checkpoint_converted_without_a_drawn_log_is_one_line(tmp_path):
    (tmp_path / "quantization_log.json").write_text(json.dumps(
        {"quantkit_version": "x", "calibration": {"num_samples": 128, "num_tokens": 1000}}))
    with pytest.raises(QuantkitError, match=r"^--calib-sample: .*quantization_log.json: no sample_content hashes "
                                            r"\(the checkpoint's calibration was not drawn"):
        sample_hashes(tmp_path)
