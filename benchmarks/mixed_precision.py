"""Benchmark: measured mixed precision against uniform W4 and the first/last-layer rule, at equal size.

    python benchmarks/mixed_precision.py --model smollm2 [--quantizer rtn|gptq] [--extra 0.5,1.5]
        [--sensitivity FILE] [--max-len 2048] [--json OUT]

One sensitivity search (or ``--sensitivity``: a saved one), then per extra budget ``x`` over
uniform W4 g64: the first/last-layer rule (W8 channel on as many layers from both ends as fit
``4.5 + x`` bits per planned weight, W4 g64 elsewhere) and the measured plan given exactly the
rule's size, so the plan is never the larger; uniform W4 g64 for reference. Each is converted
(``--quantizer``) and compared with the float model on the default suite's English text slices
(numbers-en, code-en, names-en, long-en) as ``quantkit eval`` measures them (teacher-forced KL
per token, generation left out): mean KL over the four slices.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ENGLISH = ["numbers-en", "code-en", "names-en", "long-en"]
RECIPES = {"rtn": "w4a16-g64", "gptq": "w4a16-g64-gptq"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--quantizer", choices=sorted(RECIPES), default="rtn")
    ap.add_argument("--extra", default="0.5,1.5", help="bits per weight over uniform W4 g64 (4.5 with fp32 scales)")
    ap.add_argument("--sensitivity", type=Path, default=None)
    ap.add_argument("--save-sensitivity", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=None, help="the search's calibration tokens (default: the mixed: key's)")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--only", default=None, help="comma list of plan labels to convert and measure")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import torch

    import quantkit
    import quantkit.api
    from quantkit.evaluation import SuiteOptions, evaluate
    from quantkit.evaluation.checkpoint import load_model, load_tokenizer
    from quantkit.recipe import load_recipe
    from quantkit.sensitivity import SearchOptions, Sensitivity
    from quantkit.sensitivity.plan_groups import planned_recipe
    from quantkit.sensitivity.planner import edge_layers, plan, uniform
    from sensitivity import model_dir

    folder = model_dir(args.model)
    if folder is None:
        from quantkit.inputs.embedded_model import default_model_dir
        folder = default_model_dir()
    recipe = load_recipe(RECIPES[args.quantizer])
    out = {"model": args.model, "quantizer": args.quantizer, "recipe": recipe.name, "max_len": args.max_len,
           "slices": ENGLISH, "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                                          "platform": platform.platform(), "torch": torch.__version__},
           "plans": {}}
    say = lambda m: print(m, file=sys.stderr, flush=True)   # noqa: E731
    if args.sensitivity:
        sens = Sensitivity.load(args.sensitivity)
    else:
        c0 = time.process_time()
        tokens = {} if args.tokens is None else {"tokens": args.tokens}
        sens = quantkit.api.sensitivity(folder, recipe, options=SearchOptions(**tokens), log=say)
        out["search_cpu_s"] = time.process_time() - c0
        if args.save_sensitivity:
            sens.save(args.save_sensitivity)
    out["search_seconds"] = sens.seconds
    plans = {"uniform W4_G64": uniform(sens, "W4_G64")}
    base_bits = plans["uniform W4_G64"].bits_per_weight
    for x in (float(v) for v in args.extra.split(",")):
        edge = edge_layers(sens, "W4_G64", "W8_CHANNEL", budget_bits=base_bits + x)
        plans[f"+{x} first/last"] = edge
        plans[f"+{x} measured"] = plan(sens, budget_bytes=edge.nbytes)
    base = load_model(folder)
    tok = load_tokenizer(folder)
    opts = SuiteOptions(gen_prompts=0)
    for label, p in plans.items():
        row = {"rule": p.rule, "bits_per_weight": round(p.bits_per_weight, 4), "nbytes": p.nbytes,
               "predicted_kl": p.predicted_kl, "formats": p.by_candidate(sens)}
        out["plans"][label] = row
        print(json.dumps({label: row}), flush=True)
        if args.only and label not in args.only.split(","):
            continue
        with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent.parent / ".cache") as tmp:
            c0, t0 = time.process_time(), time.perf_counter()
            q = quantkit.quantize(folder, planned_recipe(recipe, sens, p),
                                  options=quantkit.ConvertOptions(out=Path(tmp) / "ckpt", log=say))
            path = q.save()
            row["convert_cpu_s"], row["convert_wall_s"] = time.process_time() - c0, time.perf_counter() - t0
            row["checkpoint_bytes"] = q.result.bytes_after
            cand = load_model(path)
            result = evaluate(base, cand, tok, suite=ENGLISH, max_len=args.max_len, options=opts, progress=False)
        row["kl"] = {s: result.slices[s].get("kl_mean") for s in ENGLISH}
        row["kl_mean"] = sum(row["kl"].values()) / len(ENGLISH)
        row["decision"] = result.decision
        print(json.dumps({label: row}), flush=True)
        if args.json:   # after each plan: a long run stopped early keeps what it measured
            args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
