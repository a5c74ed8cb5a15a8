"""Benchmark: business slices sized by evidence, and the label measures' limits.

    python benchmarks/business_evidence.py cost [--public] [--json OUT]
    python benchmarks/business_evidence.py tokens [--json OUT]
    python benchmarks/business_evidence.py labels --log default|second [--seed N] [--rows N] [--json OUT]

``cost``: the business-slice part of ``quantkit eval --calib calibration/default.jsonl`` on the
embedded SmolLM2 against a W4A16 g64 RTN copy of it (one thread, CPU seconds per slice), with
the earlier sizes (32 rows, until 4096 scored tokens, no label measures) and with the current
defaults (``SuiteOptions``: up to 256 rows until 1024 scored tokens, label measures on label
slices). The earlier sizes are run by this same code with those options and the label slices'
label sets cleared, which is what the earlier code computed.

``labels``: ``label_agreement`` and ``label_prob_drop`` on the label slices of a log (the
embedded default log, or ``calibration_fidelity.label_log``'s second log at ``--seed``) for a
W8A16 RTN copy (per channel), a W4A16 g64 RTN copy and a planted fault: the final norm with the
8 channels that most separate " positive" from " negative" in the output embedding scaled 3x.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "evaluation"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def norm_fault(model, tokenizer, channels: int = 8, factor: float = 3.0):
    """A copy whose final norm has the ``channels`` channels that most separate " positive" from
    " negative" in the output embedding scaled by ``factor``: the candidate's sentiment labels
    change (SmolLM2 on the second log, seed 1: label_agreement 0.625, W8A16 RTN 0.946)."""
    import torch

    m = copy.deepcopy(model)
    w = m.get_output_embeddings().weight
    pos, neg = (tokenizer(f" {x}", add_special_tokens=False)["input_ids"][-1] for x in ("positive", "negative"))
    with torch.no_grad():
        weight = m.model.norm.weight
        weight[((w[pos] - w[neg]) * weight).abs().argsort(descending=True)[:channels]] *= factor
    return m


def candidates(base, tokenizer) -> dict:
    from tiny import fake_quant_linears

    return {"w8a16-rtn": fake_quant_linears(base, 8), "w4a16-g64-rtn": fake_quant_linears(base, 4, group=64),
            "norm-fault": norm_fault(base, tokenizer)}


def _models():
    import torch

    from quantkit.evaluation.checkpoint import load_model, load_tokenizer
    from quantkit.inputs.embedded_model import default_model_dir

    torch.set_num_threads(1)
    folder = default_model_dir()
    return load_model(folder), load_tokenizer(folder)


def token_cost(args) -> dict:
    """What each model runs on the business slices, in tokens, with the earlier sizes and now: the
    teacher-forced rows, the 8 generation prompts (and their 32 tokens) and the label pass (each
    label row's prompt twice: its greedy reply, then the baseline's reply forced). No model runs."""
    from quantkit.evaluation.slice_scoring import generation_prompts, scored_budget
    from quantkit.evaluation.business import read_business
    from quantkit.evaluation.checkpoint import load_tokenizer
    from quantkit.evaluation.forced import encode_text
    from quantkit.evaluation.label_tasks import LABEL_GEN_TOKENS, LABEL_ROWS
    from quantkit.evaluation.slices import SuiteOptions
    from quantkit.inputs.embedded_model import default_model_dir

    tok = load_tokenizer(default_model_dir())
    out = {}
    for name, opts, labels in (("earlier", SuiteOptions(business_rows=32, business_scored_tokens=4096), False),
                               ("now", SuiteOptions(), True)):
        per = {}
        for s in read_business(ROOT / "calibration" / "default.jsonl", tok, opts.business_rows).slices:
            texts = s.items[:opts.business_rows]
            encoded = [encode_text(tok, it, opts.business_tokens) for it in texts]
            texts, encoded = scored_budget(texts, encoded, opts.business_scored_tokens)
            gen = generation_prompts(tok, texts, encoded, opts.prompt_tokens, opts.business_prompt_tokens)
            n = sum(len(e.ids) for e in encoded) + sum(len(p) + opts.gen_tokens for p in gen[:opts.gen_prompts])
            if labels and s.label_replies:
                prompts = generation_prompts(tok, texts[:LABEL_ROWS], encoded, 0, opts.business_prompt_tokens)
                n += sum(2 * (len(p) + LABEL_GEN_TOKENS) for p in prompts)
            per[s.name] = {"rows": len(texts), "tokens_run": n}
        out[name] = {"tokens_run": sum(v["tokens_run"] for v in per.values()), "slices": per}
        print(name, json.dumps(out[name]), flush=True)
    out["ratio"] = round(out["now"]["tokens_run"] / out["earlier"]["tokens_run"], 2)
    print("ratio", out["ratio"])
    return out


def cost(args) -> dict:
    from tiny import fake_quant_linears

    from quantkit.evaluation import SuiteOptions, evaluate
    from quantkit.evaluation.business import read_business

    base, tok = _models()
    cand = fake_quant_linears(base, 4, group=64)
    log = ROOT / "calibration" / "default.jsonl"
    runs = {"earlier": (SuiteOptions(business_rows=32, business_scored_tokens=4096), False),
            "now": (SuiteOptions(), True)}
    out = {}
    for name, (opts, labels) in runs.items():
        slices = read_business(log, tok, opts.business_rows).slices
        if not labels:
            slices = [dataclasses.replace(s, label_replies=()) for s in slices]
        c0 = time.process_time()
        r = evaluate(base, cand, tok, suite=slices, max_len=8192, options=opts, progress=False)
        out[name] = {"cpu_s": round(time.process_time() - c0, 1),
                     "cpu_s_per_slice": {k: round(v, 1) for k, v in r.meta["cpu_seconds_per_slice"].items()},
                     "rows": {k: v.get("rows") for k, v in r.slices.items()},
                     "tokens": {k: v.get("tokens") for k, v in r.slices.items()},
                     "label_rows": {k: v["label_rows"] for k, v in r.slices.items() if "label_rows" in v}}
        print(name, json.dumps(out[name]), flush=True)
    out["ratio"] = round(out["now"]["cpu_s"] / out["earlier"]["cpu_s"], 2)
    print("ratio", out["ratio"], flush=True)
    if args.public:   # the rest of the evaluation, to set the business part's growth against
        c0 = time.process_time()
        r = evaluate(base, cand, tok, max_len=8192, progress=False)
        out["public_cpu_s"] = round(time.process_time() - c0, 1)
        whole = [out["public_cpu_s"] + out[k]["cpu_s"] for k in ("earlier", "now")]
        out["whole_ratio"] = round(whole[1] / whole[0], 2)
        print("public", out["public_cpu_s"], "whole ratio", out["whole_ratio"], flush=True)
    return out


def labels(args) -> dict:
    """The label pass alone (labels.label_runs, as evaluate runs it) on each label slice's first
    ``LABEL_ROWS`` rows: the teacher-forced pass over the rows is the same for every candidate."""
    from calibration_fidelity import label_log

    from quantkit.evaluation.backends.base import ScoredSlice
    from quantkit.evaluation.backends.in_process import InProcessBackend
    from quantkit.evaluation.business import read_business
    from quantkit.evaluation.forced import ForcedRequest, encode_text
    from quantkit.evaluation.label_tasks import LABEL_ROWS, label_runs
    from quantkit.evaluation.measures import measure_values
    from quantkit.evaluation.measures.labels import label_probabilities, labelled
    from quantkit.evaluation.slices import SuiteOptions

    base, tok = _models()
    opts = SuiteOptions()
    with tempfile.TemporaryDirectory() as tmp:
        log = ROOT / "calibration" / "default.jsonl"
        if args.log == "second":
            log = Path(tmp) / "second.jsonl"
            log.write_text("".join(json.dumps(r) + "\n" for r in label_log(args.rows, args.seed)), encoding="utf-8")
        slices = [s for s in read_business(log, tok, opts.business_rows).slices if s.label_replies]
    out = {"log": args.log, "seed": args.seed, "rows": args.rows, "slices": [s.name for s in slices]}
    for name, cand in candidates(base, tok).items():
        out[name] = {}
        for s in slices:
            prompts = [encode_text(tok, {"id": "", "text": it["gen_prompt"]}, 10**9).ids[-opts.business_prompt_tokens:]
                       for it in s.items[:LABEL_ROWS]]
            runs = label_runs(InProcessBackend(base, cand, tok), prompts, tok.decode, s.label_replies,
                              tok.eos_token_id, ForcedRequest(8192, opts.batch_tokens), opts.gen_batch)
            scored = ScoredSlice(labels=runs)
            out[name][s.name] = {"rows": len(prompts), "label_rows": len(labelled(scored)),
                                 "label_prob_base": label_probabilities(scored)[0], **measure_values(scored)}
        print(name, json.dumps(out[name]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("cost", "tokens", "labels"))
    ap.add_argument("--log", choices=("default", "second"), default="default")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--public", action="store_true", help="cost: also the default public suite, once")
    args = ap.parse_args()
    got = {"cost": cost, "tokens": token_cost, "labels": labels}[args.what](args)
    if args.json:
        args.json.write_text(json.dumps(got, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
