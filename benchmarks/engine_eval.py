"""Benchmark: the evaluation inside vLLM against quantkit's own path, on the same checkpoints.

    python benchmarks/engine_eval.py [--recipes fp8-dynamic w8a8] [--suite default] [--max-len N]
        [--work DIR] [--engine-python PATH] [--json benchmarks/engine_eval_measured.json]

For each recipe it converts the embedded SmolLM2-135M-Instruct (``quantkit convert --no-eval``,
kept under --work), then evaluates the checkpoint twice, one run after the other, with the same
suite and deployment length: ``quantkit eval`` (quantkit's own packed path, in process) and
``quantkit eval --engine vllm`` (both models served by vLLM's OpenAI server on 127.0.0.1, started
and stopped by quantkit: server starts included in its time). It prints, per slice, both paths'
perplexities and top-1 agreement with their differences, the path agreement, the verdicts, and
both wall times and their ratio; ``--json`` writes them with the command, machine and date.

Torch threads are pinned (``OMP_NUM_THREADS``) for both runs; on a shared machine compare the
ratio, not the seconds.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quantkit.serving.capabilities import Capabilities  # noqa: E402


def host() -> str:
    """The CPU the engine ran on and whether it has AMX, as every engine figure names it."""
    return Capabilities.from_cpuinfo(Path("/proc/cpuinfo").read_text()).describe()


def quantkit(args: list, env: dict) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "quantkit.cli", *map(str, args)], capture_output=True, text=True,
                         env=env, cwd=ROOT)
    return res, time.perf_counter() - t0


def _checked(res: subprocess.CompletedProcess, what: str) -> None:
    if res.returncode != 0:
        sys.exit(f"{what} failed ({res.returncode}): {res.stderr.strip().splitlines()[-1:]}")


def compare(own: dict, eng: dict) -> list[dict]:
    """Per slice: both paths' figures and their differences."""
    rows = []
    for name, e in eng["slices"].items():
        o = own["slices"].get(name, {})
        row = {"slice": name, "verdict_own": own["verdict"]["slices"].get(name),
               "verdict_engine": eng["verdict"]["slices"].get(name)}
        for key in ("ppl_base", "ppl_cand", "top1_agreement", "kl_mean", "gen_agreement", "gen_agreement_ci",
                    "mc_agreement", "extract_f1_drop", "extract_f1_drop_ci", "code_pass_drop", "path_ppl_gap",
                    "path_top1", "path_kl_mean"):
            if key in e:
                row[f"{key}_engine"] = e[key]
            if key in o:
                row[f"{key}_own"] = o[key]
        for key in ("ppl_base", "ppl_cand"):
            if key in e and key in o and o[key]:
                row[f"{key}_ratio"] = e[key] / o[key]
        if "top1_agreement" in e and "top1_agreement" in o:
            row["top1_diff"] = e["top1_agreement"] - o["top1_agreement"]
        rows.append(row)
    return rows


def run_one(recipe: str, args, env: dict) -> dict:
    ckpt = args.work / recipe
    if not (ckpt / "config.json").exists():
        res, _ = quantkit(["convert", "--recipe", recipe, "--out", ckpt, "--no-eval"], env)
        _checked(res, f"convert {recipe}")
    common = ["--candidate", ckpt, "--suite", args.suite, *(["--max-len", args.max_len] if args.max_len else [])]
    out_own, out_eng = args.work / f"{recipe}-eval-own", args.work / f"{recipe}-eval-engine"
    res, own_s = quantkit(["eval", *common, "--out", out_own, "--overwrite"], env)
    _checked(res, f"eval {recipe}")
    engine = ["--engine", "vllm", *(["--engine-python", args.engine_python] if args.engine_python else [])]
    res, eng_s = quantkit(["eval", *common, *engine, "--out", out_eng, "--overwrite"], env)
    own = json.loads((out_own / "report.json").read_text())
    if res.returncode != 0:   # refused (the probe: too slow on this host) or failed: its one line is the figure
        return {"recipe": recipe, "seconds_own": own_s, "seconds_engine": eng_s, "decision_own": own["verdict"]["decision"],
                "engine_refused": (res.stderr.strip().splitlines() or ["no output"])[-1], "slices": []}
    eng = json.loads((out_eng / "report.json").read_text())
    return {"recipe": recipe, "seconds_own": own_s, "seconds_engine": eng_s, "time_ratio": eng_s / own_s,
            "decision_own": own["verdict"]["decision"], "decision_engine": eng["verdict"]["decision"],
            "engine": eng["engine"], "slices": compare(own, eng)}


def table(result: dict) -> str:
    if "engine_refused" in result:
        return (f"### {result['recipe']}: in-process {result['decision_own']} in {result['seconds_own']:.0f} s, "
                f"engine refused after {result['seconds_engine']:.0f} s: {result['engine_refused']}")
    lines = [f"### {result['recipe']}: in-process {result['decision_own']} in {result['seconds_own']:.0f} s, "
             f"engine {result['decision_engine']} in {result['seconds_engine']:.0f} s "
             f"(x{result['time_ratio']:.2f})", "",
             "| slice | ppl base own / engine | ppl cand own / engine | top-1 own / engine | greedy own / engine | "
             "path ppl gap | path KL | level own / engine |", "|---|---|---|---|---|---|---|---|"]
    f = lambda r, k: f"{r[k]:.4g}" if isinstance(r.get(k), (int, float)) else "-"  # noqa: E731
    for r in result["slices"]:
        lines.append(f"| {r['slice']} | {f(r, 'ppl_base_own')} / {f(r, 'ppl_base_engine')} | "
                     f"{f(r, 'ppl_cand_own')} / {f(r, 'ppl_cand_engine')} | {f(r, 'top1_agreement_own')} / "
                     f"{f(r, 'top1_agreement_engine')} | {f(r, 'gen_agreement_own')} / {f(r, 'gen_agreement_engine')} | "
                     f"{f(r, 'path_ppl_gap_engine')} | {f(r, 'path_kl_mean_engine')} | "
                     f"{r['verdict_own']} / {r['verdict_engine']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", nargs="+", default=["fp8-dynamic", "w8a8"])
    ap.add_argument("--suite", default="default")
    ap.add_argument("--max-len", type=int, default=None, help="deployment length (default: the model's)")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "benchmarks" / "engine")
    ap.add_argument("--engine-python", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    results = []
    for recipe in args.recipes:
        results.append(run_one(recipe, args, env))
        print(table(results[-1]), "\n", flush=True)
    if args.json:
        meta = {"command": " ".join(["python", "benchmarks/engine_eval.py", *sys.argv[1:]]),
                "machine": f"{platform.machine()} {os.cpu_count()} cores", "host": host(),
                "date": time.strftime("%Y-%m-%d"),
                "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                         cwd=ROOT).stdout.strip()}
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
