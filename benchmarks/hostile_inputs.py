#!/usr/bin/env python
"""Benchmark: how fast, and in how much memory, quantkit refuses the inputs built to exhaust it.

    python benchmarks/hostile_inputs.py [--repeat 3]

Each case runs ``python -m quantkit.cli`` in a process of its own (tests/hostile.py: the peak
resident set of that process alone, read from the kernel's accounting) on a tiny model, and must
end with exit 2 and one ``error:`` line: a YAML alias bomb under a free-text key, 5000-deep
nesting, a 50 MB single-line calibration row, ``--nproc`` above the CPUs, and a calibration length
beyond the model's. The median wall time and the largest peak per case go to benchmarks/RESULTS.md
by hand; the tests assert the bounds (under 5 s and 1 GiB for the first four).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hostile import quantkit_env, run_quantkit  # noqa: E402
from model_factory import make_llama_dir, save_byte_tokenizer  # noqa: E402


def cases(root: Path) -> dict[str, list]:
    model = save_byte_tokenizer(make_llama_dir(root / "model", vocab=260))
    bomb = root / "bomb.yaml"
    lines = ["scheme: W4A16", 'a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},*a{i - 1},"
              f"*a{i - 1},*a{i - 1}]" for i in range(1, 9)]
    bomb.write_text("\n".join(lines) + "\ndescription: *a8\n")
    deep = root / "deep.yaml"
    deep.write_text("scheme: W4A16\ndescription: " + "[" * 5000 + "]" * 5000 + "\n")
    row = root / "row.jsonl"
    with open(row, "w") as fh:
        fh.write('{"text": "' + "a" * 50_000_000 + '"}\n')
    out = ["--out", root / "out", "--no-eval"]
    return {
        "yaml alias bomb (10^9 nodes)": ["convert", model, "--recipe", bomb, *out],
        "yaml nested 5000 deep": ["convert", model, "--recipe", deep, *out],
        "50 MB calibration row": ["calibrate", row, "--model", model, "--out", root / "calib"],
        f"--nproc {len(os.sched_getaffinity(0)) + 1}": ["convert", model, "--recipe", "w8a16",
                                                        "--nproc", str(len(os.sched_getaffinity(0)) + 1), *out],
        "--max-seq-len 99999999999": ["convert", model, "--recipe", "w8a16-gptq", "--max-seq-len", "99999999999",
                                      *out],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    print("| case | exit | median s | peak MiB |")
    print("| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as box:
        root = Path(box)
        for name, argv in cases(root).items():
            runs = [run_quantkit(argv, cwd=root, env=quantkit_env(TMPDIR=box), timeout=120) for _ in range(args.repeat)]
            codes = {r.returncode for r in runs}
            print(f"| {name} | {','.join(map(str, sorted(codes)))} | {statistics.median(r.seconds for r in runs):.2f} | "
                  f"{max(r.peak_rss_bytes for r in runs) / 2**20:.0f} |", flush=True)


if __name__ == "__main__":
    main()
