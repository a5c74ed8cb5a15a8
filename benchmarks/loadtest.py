"""Benchmark: ``quantkit loadtest`` of the embedded SmolLM2 and its W8A8 checkpoint on vLLM's CPU
build (both in the dtype the host gives the checkpoint), with the bundled calibration log as traffic.

    python benchmarks/loadtest.py [--recipe w8a8] [--slo ttft=2s,tpot=100ms] [--max-minutes 12]
        [--work DIR] [--engine-python PATH] [--json benchmarks/loadtest_measured.json]

It converts the checkpoint once (``quantkit convert --no-eval``, kept under --work), then runs one
load test with the baseline and the candidate ramped in turn on the same requests (servers
started and stopped by quantkit with the launch config of the memory account), and prints each
ramp's steps, knee, recommended concurrency, best goodput, the speedup and the wall time of each
ramp; ``--json`` writes them with the command, machine, date and commit.

vLLM's CPU build sizes its own threads; run it alone on the machine: a second server or a
concurrent job changes every figure.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quantkit.serving.capabilities import Capabilities  # noqa: E402


def quantkit(args: list) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "quantkit.cli", *map(str, args)], capture_output=True, text=True,
                         cwd=ROOT)
    return res, time.perf_counter() - t0


def _checked(res: subprocess.CompletedProcess, what: str) -> None:
    if res.returncode != 0:
        sys.exit(f"{what} failed ({res.returncode}): {res.stderr.strip().splitlines()[-3:]}")


def _commit() -> str:
    res = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return res.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="w8a8")
    ap.add_argument("--traffic", type=Path, default=ROOT / "calibration" / "default.jsonl")
    ap.add_argument("--slo", default="ttft=2s,tpot=100ms")
    ap.add_argument("--max-minutes", type=float, default=12.0)
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "benchmarks" / "engine")
    ap.add_argument("--engine-python", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    ckpt = args.work / args.recipe
    if not (ckpt / "config.json").exists():
        _checked(quantkit(["convert", "--recipe", args.recipe, "--out", ckpt, "--no-eval"])[0], "convert")
    out = args.work / f"{args.recipe}-loadtest"
    cmd = ["loadtest", ckpt, "--engine", "vllm", "--baseline", "default", "--traffic", args.traffic, "--slo", args.slo,
           "--max-minutes", args.max_minutes, "--out", out, "--overwrite",
           *(["--engine-python", args.engine_python] if args.engine_python else [])]
    res, seconds = quantkit(cmd)
    _checked(res, "loadtest")
    data = json.loads((out / "report.json").read_text())
    print(res.stdout)
    for r in data["ramps"]:
        print(f"{r['role']}: knee {r['knee']}, recommended {r['recommended_concurrency']}, stopped: {r['stopped']}")
        for s in r["steps"]:
            print(f"  c={s['concurrency']:>3} req/s {s['requests_per_s']:.3g} out tok/s {s['output_tokens_per_s']:.4g} "
                  f"goodput {s['goodput_rps']:.3g} TPOT p50/p99 {s['tpot_ms']['p50']:.3g}/{s['tpot_ms']['p99']:.3g} ms "
                  f"TTFT p50/p99 {s['ttft_ms']['p50']:.4g}/{s['ttft_ms']['p99']:.4g} ms")
    print(f"speedup: {data['speedup']}; wall {seconds:.0f} s")
    if args.json:
        meta = {"command": "python benchmarks/loadtest.py " + " ".join(sys.argv[1:]),
                "machine": f"{platform.machine()} {__import__('os').cpu_count()} cores",
                "host": Capabilities.from_cpuinfo(Path("/proc/cpuinfo").read_text()).describe(),
                "date": time.strftime("%Y-%m-%d"), "commit": _commit(), "seconds": seconds}
        args.json.write_text(json.dumps({"meta": meta, "report": data}, indent=1) + "\n")


if __name__ == "__main__":
    main()
