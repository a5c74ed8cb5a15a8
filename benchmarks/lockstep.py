"""Calibration batch size for GPTQ's one lockstep pass per layer (quantkit/pipeline/interleave.py).

Runs ``quantkit.quantize`` on the embedded SmolLM2-135M with the GPTQ setting of
benchmarks/gptq.py (W4A16 sym g64, act-order weight, mse ranges) on ``--samples`` Lee-corpus
windows of 512 tokens, with ``pipeline.MICRO_BATCH_TOKENS`` set to ``--batch-tokens``
(4096: the default; 65536 or more: the whole set in one batch), and prints wall time, CPU
time and peak RSS.

Usage:
    python benchmarks/lockstep.py --samples 32 --batch-tokens 4096 --threads 2
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import torch

    import quantkit
    import quantkit.pipeline.batches as pipeline

    sys.path.insert(0, str(HERE))
    import gptq as bench

    torch.set_num_threads(a.threads)
    pipeline.MICRO_BATCH_TOKENS = a.batch_tokens
    folder = bench.model_dir("smollm2")
    lee = bench.encode(bench.load_tokenizer(folder), bench.heldout_text())
    calib = bench.token_windows(lee[40 * 512:], a.samples, 512, 0)  # after the held-out windows, as gptq.py
    recipe = {"version": 1, "config_groups": bench.scheme_dict(64, "weight", "mse"), "ignore": ["lm_head"],
              "algorithm": {"name": "gptq"}, "calibration": {"num_samples": len(calib), "max_seq_len": 512}}
    workdir = HERE.parent / ".cache" / "benchmarks" / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()
    quantkit.quantize(folder, recipe, calib, quantkit.ConvertOptions(workdir=workdir))
    print(f"batch_tokens {a.batch_tokens} threads {a.threads} samples {a.samples}: "
          f"{time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU, "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB")


if __name__ == "__main__":
    main()
