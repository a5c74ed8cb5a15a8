"""Tokens/s of the torch reference backend against the fp32 model on the CPU.

Evaluation runs quantized checkpoints through `quantkit.load` on the torch reference path; it
must not be the reason evaluation is slow. Measures prefill (one 512-token sequence) and
greedy decode (64 new tokens, KV cache) for SmolLM2-135M fp32 and its W4A16 g64 checkpoint,
median of several runs, and prints the ratios.

    python benchmarks/reference_speed.py [--runs 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def _time(fn, runs):
    fn()  # warm-up (first call dequantizes and caches each layer's weight)
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--recipe", default="w4a16-g64")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import quantkit
    from quantkit.inputs.embedded_model import default_model_dir
    from transformers import AutoModelForCausalLM

    src = default_model_dir()
    fp32 = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with tempfile.TemporaryDirectory() as d:
        path = quantkit.quantize(src, a.recipe).save(Path(d) / "q")
        q = quantkit.load(path, backend="torch")
        ids = torch.randint(0, 49152, (1, 512), generator=torch.Generator().manual_seed(0))
        rows = []
        for name, model in (("fp32", fp32), (a.recipe, q)):
            with torch.no_grad():
                prefill = _time(lambda: model(ids), a.runs)
                decode = _time(lambda: model.generate(ids[:, :32], max_new_tokens=64, min_new_tokens=64,
                                                      do_sample=False), a.runs)
            rows.append((name, 512 / prefill, 64 / decode))
    print(f"torch {torch.__version__}, {a.threads} threads, median of {a.runs}")
    print("| model | prefill tokens/s (512) | decode tokens/s (64 new) |")
    print("| --- | --- | --- |")
    for name, p, g in rows:
        print(f"| {name} | {p:.0f} | {g:.1f} |")
    pr, dr = rows[1][1] / rows[0][1], rows[1][2] / rows[0][2]
    ok = min(pr, dr) >= 0.5
    print(f"ratio to fp32: prefill {pr:.2f}, decode {dr:.2f} (target >= 0.5): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
