#!/usr/bin/env python
"""Benchmark: draw 512 calibration samples from a 100k-row traffic log.

    python benchmarks/sampler.py [--rows 100000] [--n 512] [--max-len 2048] [--repeat 3]

The log is the acceptance test's skewed mix of real text (tests/calibration/skewed_log.py:
half short chat, code, summaries, long documents with questions, zh/en), written once to a temp
folder. Each repeat times a full ``calibrate`` call (read, render with the chat template, dedup,
batched fast-tokenizer counting, stratified draw, manifest, report with plots, atomic write) and
reports wall and process CPU seconds (all threads, so CPU / 2 bounds the wall time of an idle
2-core machine from below); the median goes to benchmarks/RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "calibration"))

from skewed_log import build_skewed_log, real_units_from  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", default=None, help="tokenizer folder (default: the embedded model's)")
    args = ap.parse_args()

    from quantkit.calibration import SamplerConfig, calibrate
    from quantkit.calibration import sampler as sampler_module
    from quantkit.calibration.tokenizer import resolve_tokenizer

    tok_cpu = []
    count_tokens = sampler_module.count_tokens

    def timed_count(*a, **k):  # CPU seconds of the batched tokenizer call (all its threads)
        c = time.process_time()
        out = count_tokens(*a, **k)
        tok_cpu.append(time.process_time() - c)
        return out

    sampler_module.count_tokens = timed_count

    tok = resolve_tokenizer(args.model)
    rows = [json.loads(l) for l in (ROOT / "calibration" / "default.jsonl").read_text(encoding="utf-8").splitlines()]
    with tempfile.TemporaryDirectory(prefix="bench-sampler-") as tmp:
        log = Path(tmp) / "traffic.jsonl"
        build_skewed_log(log, real_units_from(rows), rows=args.rows)
        print(f"log: {args.rows} rows, {log.stat().st_size / 1e6:.1f} MB; machine: {platform.machine()}, "
              f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", flush=True)
        cfg = SamplerConfig(num_samples=args.n, max_len=args.max_len, seed=0)
        walls, cpus = [], []
        for k in range(args.repeat):
            cpu0, t0 = time.process_time(), time.perf_counter()
            res = calibrate(log, tok, cfg, out=Path(tmp) / f"out{k}")
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - cpu0)
            c = res.manifest["counts"]
            print(f"run {k + 1}: {walls[-1]:.1f} s wall, {cpus[-1]:.1f} s CPU of which {tok_cpu[-1]:.1f} s in "
                  f"token counting ({res.manifest['counts']['valid']} rows); {c['selected']} samples from "
                  f"{c['pool']} rows, {len(res.manifest['cells'])} cells; load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
    print(f"median: {statistics.median(walls):.1f} s wall, {statistics.median(cpus):.1f} s CPU "
          f"({statistics.median(tok_cpu):.1f} s of it counting tokens) over {args.repeat} runs")


if __name__ == "__main__":
    main()
