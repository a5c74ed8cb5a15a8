"""Task metrics where a slice has labels: multiple-choice accuracy, extraction F1 and code
pass rate, each for the baseline and the candidate on identical prompts.
"""
from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

import torch

from quantkit.evaluation.code_exec import humaneval_program, run_program, stops_body, truncate_completion
from quantkit.evaluation.causal_lm import forward_logits, greedy
from quantkit.evaluation.sandbox import Runner
from quantkit.evaluation.text_window import context

LETTERS = "ABCD"


def mc_prompt(item: dict) -> str:
    lines = [f"Question: {item['question'].strip()}"]
    lines += [f"{LETTERS[i]}. {c}" for i, c in enumerate(item["choices"])]
    return "\n".join(lines) + "\nAnswer:"


def mc_continuations(tokenizer, item: dict) -> tuple[list[int], list[list[int]]]:
    """The question's tokens and, per choice, the tokens its letter (" A".." D") continues them with."""
    prompt = mc_prompt(item)
    ctx = tokenizer(prompt)["input_ids"]
    return ctx, [tokenizer(prompt + " " + LETTERS[i])["input_ids"][len(ctx):] for i in range(len(item["choices"]))]


def multiple_choice(model, tokenizer, items: list[dict], pad: int, batch: int = 8) -> list[int]:
    """Predicted choice per item: the letter whose continuation (" A".." D") is most likely.

    Scored like lm-eval's ``multiple_choice`` (sum of the continuation's log-probabilities);
    when every letter is one token, one forward pass per question serves all four.
    """
    preds = []
    for s in range(0, len(items), batch):
        seqs, options = [], []   # options: per item, (row, continuation, context length)
        for it in items[s:s + batch]:
            ctx, conts = mc_continuations(tokenizer, it)
            if all(len(c) == 1 for c in conts):
                seqs.append(ctx)
                options.append([(len(seqs) - 1, c, len(ctx)) for c in conts])
            else:
                opts = []
                for c in conts:
                    seqs.append(ctx + c)
                    opts.append((len(seqs) - 1, c, len(ctx)))
                options.append(opts)
        logp = torch.log_softmax(forward_logits(model, seqs, pad), dim=-1)
        for opts in options:
            # the logits at position n - 1 + k predict continuation token k
            scores = [float(sum(logp[row, n - 1 + k, t] for k, t in enumerate(c))) for row, c, n in opts]
            preds.append(max(range(len(scores)), key=scores.__getitem__))
    return preds


NUMBER_RE = re.compile(r"\d+(?:[.,]\d+)*")


def normalise_numbers(text: str) -> list[str]:
    """Numbers in text, NFKC-normalised (full-width digits -> ASCII), thousands commas dropped.

    >>> normalise_numbers("１，２００元 and 3.5%")
    ['1200', '3.5']
    """
    text = unicodedata.normalize("NFKC", text)
    out = []
    for m in NUMBER_RE.findall(text):
        m = re.sub(r",(?=\d{3}\b)", "", m).rstrip(".,")
        out.append(m)
    return out


def f1(pred: list[str], ref: list[str]) -> float:
    """Multiset F1.

    >>> f1(["1", "2"], ["2", "3"])
    0.5
    """
    if not pred and not ref:
        return 1.0
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    p, r = common / len(pred), common / len(ref)
    return 2 * p * r / (p + r)


def chat_ids(tokenizer, prompt: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(prompt + "\n")["input_ids"]


def extraction(model, tokenizer, items: list[dict], n_tokens: int, pad: int, eos, batch: int) -> list[dict]:
    out = []
    for s in range(0, len(items), batch):
        chunk = items[s:s + batch]
        gens = greedy(model, [chat_ids(tokenizer, it["prompt"]) for it in chunk], n_tokens, pad, eos)
        out += [extraction_result(tokenizer, it, g) for it, g in zip(chunk, gens)]
    return out


def extraction_result(tokenizer, item: dict, reply: list[int]) -> dict:
    """A reply's text and its F1 against the item's reference numbers. The reply is cut after N
    tokens, maybe inside a character: its text holds whole characters only (text_window.py)."""
    text = context(lambda ids: tokenizer.decode(ids, skip_special_tokens=True), reply, 0, len(reply))
    ref = [n for r in item["reference"] for n in normalise_numbers(str(r))]
    return {"id": item["id"], "output": text, "f1": f1(normalise_numbers(text), ref)}


@dataclass(frozen=True)
class CodeExecution:
    """Where each completion's program runs (the sandbox, see sandbox.py) and for how long at most."""

    runner: Runner
    timeout_s: float


def code_pass(model, tokenizer, items: list[dict], n_tokens: int, pad: int, eos, batch: int,
              execution: CodeExecution) -> list[dict]:
    """Greedy completions run against their tests as ``execution`` says."""
    def finished(ids: list[int]) -> bool:   # the body is over: truncate_completion cuts here
        return stops_body(tokenizer.decode(ids, skip_special_tokens=True))

    out = []
    for s in range(0, len(items), batch):
        chunk = items[s:s + batch]
        gens = greedy(model, [tokenizer(it["prompt"])["input_ids"] for it in chunk], n_tokens, pad, eos,
                      stop=finished)
        out += [code_result(tokenizer, it, g, execution) for it, g in zip(chunk, gens)]
    return out


def code_result(tokenizer, item: dict, completion_ids: list[int], execution: CodeExecution) -> dict:
    """A completion run against the problem's tests as ``execution`` says."""
    completion = tokenizer.decode(completion_ids, skip_special_tokens=True)
    res = run_program(humaneval_program(item, completion), execution.runner, timeout_s=execution.timeout_s)
    return {"id": item["id"], "completion": truncate_completion(completion), "passed": res.passed,
            "status": res.status}


def mc_summary(items: list[dict], pb: list[int], pc: list[int]) -> dict:
    n = len(items)
    gold = [it["answer"] for it in items]
    return {"mc_items": n,
            "mc_accuracy_base": sum(p == g for p, g in zip(pb, gold)) / n,
            "mc_accuracy_cand": sum(p == g for p, g in zip(pc, gold)) / n,
            "mc_agreement": sum(a == b for a, b in zip(pb, pc)) / n}

