"""Benchmark: business slices sized by evidence, and the label measures' limits.

    python benchmarks/business_evidence.py cost [--json OUT]
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
16 channels that most separate " positive" from " negative" in the output embedding zeroed.
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


def norm_fault(model, tokenizer, channels: int = 16):
    """A copy whose final norm has the ``channels`` channels that most separate " positive" from
    " negative" in the output embedding zeroed: the candidate's sentiment labels change."""
    import torch

    m = copy.deepcopy(model)
    w = m.get_output_embeddings().weight
    pos, neg = (tokenizer(f" {x}", add_special_tokens=False)["input_ids"][-1] for x in ("positive", "negative"))
    with torch.no_grad():
        weight = m.model.norm.weight
        weight[((w[pos] - w[neg]) * weight).abs().argsort(descending=True)[:channels]] = 0.0
    return m


def candidates(base, tokenizer) -> dict:
    from tiny import fake_quant_linears

    return {"w8a16-rtn": fake_quant_linears(base, 8), "w4a16-g64-rtn": fake_quant_linears(base, 4, group=64),
            "norm-fault": norm_fault(base, tokenizer)}


def _models():
    import torch

    from quantkit.evaluation.checkpoint import load_model, load_tokenizer
    from quantkit.inputs.models import default_model_dir

    torch.set_num_threads(1)
    folder = default_model_dir()
    return load_model(folder), load_tokenizer(folder)


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
    print("ratio", out["ratio"])
    return out


def labels(args) -> dict:
    from calibration_fidelity import label_log

    from quantkit.evaluation import SuiteOptions, evaluate
    from quantkit.evaluation.business import read_business

    base, tok = _models()
    with tempfile.TemporaryDirectory() as tmp:
        log = ROOT / "calibration" / "default.jsonl"
        if args.log == "second":
            log = Path(tmp) / "second.jsonl"
            log.write_text("".join(json.dumps(r) + "\n" for r in label_log(args.rows, args.seed)), encoding="utf-8")
        opts = SuiteOptions(gen_prompts=0)
        slices = [s for s in read_business(log, tok, opts.business_rows).slices if s.label_replies]
        out = {"log": args.log, "seed": args.seed, "rows": args.rows, "slices": [s.name for s in slices]}
        for name, cand in candidates(base, tok).items():
            r = evaluate(base, cand, tok, suite=slices, max_len=8192, options=opts, progress=False)
            out[name] = {s: {k: r.slices[s].get(k) for k in ("label_rows", "label_agreement", "label_prob_base",
                                                             "label_prob_cand", "label_prob_drop", "kl_mean", "tokens")}
                         for s in r.slices}
            print(name, json.dumps(out[name]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("cost", "labels"))
    ap.add_argument("--log", choices=("default", "second"), default="default")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    got = cost(args) if args.what == "cost" else labels(args)
    if args.json:
        args.json.write_text(json.dumps(got, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
