"""The README's main job, timed: ``quantkit convert --recipe w4a16-g64-gptq`` on the embedded
default, conversion and the full default evaluation that follows it.

Prints (and with ``--json`` writes) the whole command's wall time and CPU time, the
conversion's own seconds (its ``done:`` line), the evaluation's seconds in total and per slice
(``eval/report.json`` meta) and the verdict. The target is at most 10 minutes on the 2-core
CI machine with nothing else running: check ``uptime`` before a run that is meant to show it.

Usage:
    python benchmarks/main_job.py --runs 1 --json /tmp/main_job.json
    python benchmarks/main_job.py --threads 1       # OMP_NUM_THREADS for the run (default: torch's)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUANTKIT = Path(sys.executable).with_name("quantkit")


def one_run(recipe: str, threads: int | None) -> dict:
    out_root = Path(tempfile.mkdtemp(prefix="quantkit-main-job-"))
    out = out_root / "model"
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([str(QUANTKIT), "convert", "--recipe", recipe, "--out", str(out)], env=env,
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        if proc.returncode != 0:
            raise SystemExit(f"quantkit convert failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        done = re.search(r"^done: .*?; ([0-9.]+) s;", proc.stdout + proc.stderr, re.M)
        report = json.loads((out / "eval" / "report.json").read_text())
        meta = report["meta"]
        return {"wall_s": round(wall, 1),
                "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
                "convert_s": float(done.group(1)) if done else None,
                "eval_s": meta["seconds_total"], "eval_cpu_s": meta["cpu_seconds_total"],
                "eval_slices_s": meta["seconds_per_slice"], "integrity_s": meta.get("integrity_seconds"),
                "decision": report["verdict"]["decision"]}
    finally:
        shutil.rmtree(out_root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="w4a16-g64-gptq")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS for the run (default: unset)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    load = os.getloadavg()
    runs = []
    for k in range(a.runs):
        r = one_run(a.recipe, a.threads)
        runs.append(r)
        print(f"run {k + 1}: {r['wall_s']:.0f} s wall ({r['cpu_s']:.0f} CPU s): convert {r['convert_s']} s, "
              f"evaluation {r['eval_s']:.0f} s; {r['decision']}", flush=True)
    summary = {"recipe": a.recipe, "threads": a.threads, "cpus": os.cpu_count(), "load_before": load,
               "load_after": os.getloadavg(), "median_wall_s": statistics.median(r["wall_s"] for r in runs),
               "runs": runs}
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
