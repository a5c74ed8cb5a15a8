"""Benchmark: how well the cheap sensitivity scores rank units like the exact KL does.

    python benchmarks/sensitivity.py --model smollm2 [--tokens 8192] [--exact-units 40]
        [--exact-candidates W4_G64,W8_CHANNEL] [--labels sampled,data] [--json OUT]
    python benchmarks/sensitivity.py --exact-from S.json --tokens 2048,4096 --labels sampled --gptq-time [--disjoint]

One search per label kind and token count (the first also measures ``--exact-units`` units one
at a time, spread over the depth, in each exact candidate, unless ``--exact-from`` gives a saved
search's exact KL); every score variant is graded against that exact KL (Spearman per candidate
over units, and pooled), with the wall and CPU time of each part. ``--gptq-time``: also the CPU
seconds of a plain conversion with the recipe, for the search's share of it. ``--disjoint``
(with ``--exact-from``): score only calibration texts the saved search's exact KL was not
measured on (a search of N tokens otherwise draws its texts from the same even spread, so the
score and its ground truth share tokens); the exact KL's texts are rebuilt as that search drew
them (``--exact-search-tokens``, ``--exact-tokens``) and checked against its recorded count. The recipe is
the main job's (w4a16-g64-gptq: mse ranges, activation order), calibration the bundled sample.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def model_dir(name: str):
    if name == "smollm2":
        return None   # the embedded default
    if name == "gemma3":
        from gemma3 import gemma3_model_dir
        return gemma3_model_dir()
    return Path(name)


def disjoint_samples(folder, args, saved) -> tuple[list[list[int]], dict]:
    """The recipe's calibration samples less the texts ``saved``'s exact KL was measured on."""
    from quantkit.workflows.model_inputs import resolve_calibration, resolve_model
    from quantkit.recipe import load_recipe
    from quantkit.sensitivity.search import subset

    if saved is None or not saved.exact:
        sys.exit("error: --disjoint: needs --exact-from with a search that measured exact KL")
    config, source, model_folder = resolve_model(folder, False)
    source.close()
    samples = resolve_calibration(None, load_recipe(args.recipe), model_folder)
    exact = subset(subset(samples, args.exact_search_tokens), args.exact_tokens)
    n_exact = sum(map(len, exact))
    if n_exact != saved.agreement.get("exact_tokens"):
        sys.exit(f"error: --exact-search-tokens / --exact-tokens: they rebuild {n_exact} exact-KL tokens, "
                 f"{args.exact_from} measured {saved.agreement.get('exact_tokens')}")
    seen = {tuple(x) for x in exact}
    rest = [x for x in samples if tuple(x) not in seen]
    return rest, {"exact_tokens": n_exact, "samples_left": len(rest), "tokens_left": sum(map(len, rest))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--recipe", default="w4a16-g64-gptq")
    ap.add_argument("--tokens", default="8192", help="comma list: one search per count")
    ap.add_argument("--exact-from", type=Path, default=None, help="a sensitivity.json whose exact KL grades these")
    ap.add_argument("--disjoint", action="store_true", help="with --exact-from: score texts outside the exact KL's")
    ap.add_argument("--exact-search-tokens", type=int, default=8192, help="--disjoint: the saved search's --tokens")
    ap.add_argument("--gptq-time", action="store_true")
    ap.add_argument("--exact-units", type=int, default=40)
    ap.add_argument("--exact-candidates", default="W4_G64,W8_CHANNEL")
    ap.add_argument("--exact-tokens", type=int, default=2048)
    ap.add_argument("--labels", default="sampled,data")
    ap.add_argument("--save", type=Path, default=None, help="sensitivity.json of the first search")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()

    import torch

    import quantkit
    import quantkit.api
    from quantkit.sensitivity import SearchOptions, Sensitivity
    from quantkit.sensitivity.search import agreement

    folder = model_dir(args.model)
    out = {"model": args.model, "recipe": args.recipe, "tokens": args.tokens, "exact_tokens": args.exact_tokens,
           "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                       "platform": platform.platform(), "torch": torch.__version__}, "runs": {}}
    first = Sensitivity.load(args.exact_from) if args.exact_from else None
    calibration = None
    if args.disjoint:
        calibration, out["disjoint"] = disjoint_samples(folder, args, first)
    for tokens in (int(t) for t in args.tokens.split(",")):
        for labels in args.labels.split(","):
            options = SearchOptions(tokens=tokens, labels=labels, exact_units=args.exact_units if first is None else 0,
                                    exact_candidates=args.exact_candidates.split(","), exact_tokens=args.exact_tokens)
            s = quantkit.api.sensitivity(folder, args.recipe, calibration, options=options,
                                         log=lambda m: print(m, file=sys.stderr))
            if first is None:
                first = s
                if args.save:
                    s.save(args.save)
            else:
                s.exact = first.exact
                s.agreement = agreement(s)
            key = f"{labels} {tokens}"
            out["runs"][key] = {"agreement": s.agreement, "seconds": s.seconds, "calibration": s.calibration}
            print(json.dumps({key: out["runs"][key]}, indent=1), flush=True)
    if args.gptq_time:
        c0, t0 = time.process_time(), time.perf_counter()
        quantkit.quantize(folder, args.recipe)
        out["convert"] = {"recipe": args.recipe, "cpu_s": round(time.process_time() - c0, 2),
                          "wall_s": round(time.perf_counter() - t0, 2)}
        print(json.dumps(out["convert"]), flush=True)
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
