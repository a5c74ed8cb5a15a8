"""Benchmark: what a decode step of vLLM costs as more sequences share it, per checkpoint.

    python benchmarks/engine_step_cost.py CKPT [CKPT ...] [--tokens 64] [--batches 1 8 32]
        [--engine-python PATH] [--json out.json]

For each checkpoint folder it starts vLLM's OpenAI server as ``quantkit eval --engine vllm`` does
(quantkit.serving.vllm.serve: 127.0.0.1, float32 on the CPU, stopped with its whole process tree),
sends one warm-up request, then for each batch size n sends n greedy requests of ``--tokens``
tokens at once (100-token prompts of distinct token ids, ``ignore_eos``: every sequence decodes to
the end) and times them. The ratio of n = 32 to n = 1 says whether a step's cost is set by the
weights (about 1: sending the calls of several slices together pays) or by the sequences.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quantkit.serving.vllm import ServeOptions, find_engine, serve  # noqa: E402


def timed_batches(endpoint, tokens: int, batches: list[int]) -> dict[int, float]:
    def one(i: int) -> None:
        prompt = list(range(1000 + 7 * i, 1100 + 7 * i))
        endpoint.completions({"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}, 600)

    one(0)   # warm-up
    out = {}
    for n in batches:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(one, range(n)))
        out[n] = time.perf_counter() - t0
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoints", nargs="+", type=Path)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--engine-python", default=None)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    engine = find_engine(args.engine_python)
    rows = []
    for ckpt in args.checkpoints:
        with serve(engine, ckpt, ServeOptions(max_model_len=2048)) as served:
            got = timed_batches(served.endpoint, args.tokens, args.batches)
            quant = served.settings.get("quantization")
        row = {"checkpoint": ckpt.name, "quantization": quant,
               "seconds": {str(n): round(s, 2) for n, s in got.items()},
               "per_step_s": {str(n): round(s / args.tokens, 4) for n, s in got.items()},
               "ratio_last_first": round(got[args.batches[-1]] / got[args.batches[0]], 2)}
        rows.append(row)
        print(f"{ckpt.name}: " + ", ".join(f"{n} seq {s:.2f} s" for n, s in got.items())
              + f"; {args.batches[-1]} / {args.batches[0]}: {row['ratio_last_first']}x", flush=True)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT).stdout.strip()
        meta = {"command": " ".join(sys.argv), "machine": f"{platform.machine()}, {platform.processor() or ''}".strip(", "),
                "date": time.strftime("%Y-%m-%d"), "commit": commit, "vllm": engine.version, "host": engine.capabilities.describe(), "tokens": args.tokens}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
