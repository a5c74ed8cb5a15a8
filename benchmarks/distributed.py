"""Data-parallel calibration: 2 gloo ranks x 1 thread against 1 rank x 2 threads.

Converts the same model with the same recipe twice through the command line, ``quantkit
convert --nproc 2`` with ``OMP_NUM_THREADS=1`` and one rank with ``OMP_NUM_THREADS=2``, both
pinned to the same two cores, and reports each run's wall and CPU seconds (the children's
rusage: on a shared machine the wall time alone says little), the load average around each,
and how far the checkpoints are apart (tests/checkpoint_diff.py: share of differing int4
codes, largest code step, largest relative scale difference, other tensors not
bit-identical) and the largest difference of their logits on a held-out text.

    python benchmarks/distributed.py [--model DIR] [--recipe w4a16-g64-gptq] [--cpus 0,1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from checkpoint_diff import checkpoint_difference  # noqa: E402


def _load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def convert(model: str | None, recipe: str, out: Path, threads: int, nproc: int, cpus: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    cmd = ["taskset", "-c", cpus, sys.executable, "-m", "quantkit", "convert", *([model] if model else []),
           "--recipe", recipe, "--out", str(out), "--no-eval", "--nproc", str(nproc)]
    before, load0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), _load_avg(), time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"ranks": nproc, "threads_per_rank": threads, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "load_before": load0, "load_after": _load_avg()}


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def logits_difference(a: Path, b: Path, tokens: int = 256) -> dict:
    """Largest |Δ logit| and the two perplexities on a held-out English text (pydoc topics)."""
    import pydoc_data.topics
    from transformers import AutoTokenizer

    import quantkit

    text = "\n\n".join(list(pydoc_data.topics.topics.values())[-20:])
    ids = AutoTokenizer.from_pretrained(a)(text, return_tensors="pt")["input_ids"][:, :tokens]
    out = []
    for folder in (a, b):
        model = quantkit.load(folder)
        with torch.no_grad():
            out.append(model(ids).logits.float())
        del model
    ppl = [float(torch.nn.functional.cross_entropy(lg[0, :-1], ids[0, 1:]).exp()) for lg in out]
    return {"tokens": int(ids.shape[1]), "max_abs_logit_diff": float((out[0] - out[1]).abs().max()),
            "ppl_one_rank": round(ppl[0], 4), "ppl_two_ranks": round(ppl[1], 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--recipe", default="w4a16-g64-gptq")
    ap.add_argument("--cpus", default="0,1", help="the two cores both runs are pinned to")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(dir=".") as tmp:
        one = convert(args.model, args.recipe, Path(tmp) / "one", threads=2, nproc=1, cpus=args.cpus)
        two = convert(args.model, args.recipe, Path(tmp) / "two", threads=1, nproc=2, cpus=args.cpus)
        diff = checkpoint_difference(tensors(Path(tmp) / "one"), tensors(Path(tmp) / "two"))
        logits = logits_difference(Path(tmp) / "one", Path(tmp) / "two")
    row = {"recipe": args.recipe, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "one_rank": one, "two_ranks": two, "difference": diff, "logits": logits}
    if args.json:
        print(json.dumps(row))
        return
    for r in (one, two):
        print(f"{r['ranks']} rank(s) x {r['threads_per_rank']} thread(s): {r['wall_s']} s wall, {r['cpu_s']} s CPU "
              f"(load {r['load_before']} -> {r['load_after']})")
    print(f"codes differing: {diff['differing_codes']} of {diff['codes']} ({diff['code_share']:.2e}), "
          f"max step {diff['max_code_step']}; scales max rel diff {diff['scale_rtol']:.2e}; "
          f"other tensors not bit-identical: {diff['other'] or 'none'}")
    print(f"logits on {logits['tokens']} tokens: max |diff| {logits['max_abs_logit_diff']:.3e}; "
          f"ppl {logits['ppl_one_rank']} (1 rank) vs {logits['ppl_two_ranks']} (2 ranks)")


if __name__ == "__main__":
    main()
