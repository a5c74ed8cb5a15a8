"""Data-parallel calibration: 2 gloo ranks x 1 thread against 1 rank x 2 threads.

Converts the same model with the same recipe twice through the command line, ``quantkit
convert --nproc 2`` with ``OMP_NUM_THREADS=1`` and one rank with ``OMP_NUM_THREADS=2``, both
pinned to the same two cores, and reports each run's wall and CPU seconds (the children's
rusage: on a shared machine the wall time alone says little) and the load average around
each, how far the checkpoints are apart (tests/checkpoint_diff.py: share of differing int4
codes, largest code step, largest relative scale difference, other tensors not
bit-identical), and each one's quality on a held-out text (pydoc topics, 4 rows of 512
tokens): perplexity and mean KL(float || quantized) per token.

The tolerance it checks (docs/DESIGN.md, tests/checkpoint_diff.py): every tensor outside the
packed targets bit-identical, and the 2-rank checkpoint's perplexity within ``PPL_RTOL`` and
its KL within ``KL_RTOL`` of the 1-rank one's; exit status 1 when it does not hold. Codes are
reported, not checked: one process that changes only its thread count, or only the grouping
of its calibration batches, changes as many on SmolLM2 (benchmarks/RESULTS.md; ``--spread`` adds that run: 1 rank x 1 thread, calibration micro-batches halved, on the last
of ``--cpus``).

    python benchmarks/distributed.py [--model DIR] [--recipe w4a16-g64-gptq] [--num-samples N]
                                     [--cpus 0,1] [--spread] [--json]
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
from checkpoint_diff import KL_RTOL, PPL_RTOL, checkpoint_difference, quality_violations  # noqa: E402


def _load_avg() -> float:
    return round(os.getloadavg()[0], 2)


#: ``python -c`` entry that runs the command line with smaller calibration micro-batches: only the
#: grouping of the batches, so the Hessians' summation order, changes (``--spread``)
_HALVED_MICRO_BATCH = ("import quantkit.pipeline.batches as b; b.MICRO_BATCH_TOKENS //= 2; "
                       "from quantkit.cli import main; main()")


def convert(model: str | None, recipe: str, out: Path, threads: int, nproc: int, cpus: str,
            num_samples: int | None = None, halved_micro_batch: bool = False) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    entry = ["-c", _HALVED_MICRO_BATCH] if halved_micro_batch else ["-m", "quantkit"]
    cmd = ["taskset", "-c", cpus, sys.executable, *entry, "convert", *([model] if model else []),
           "--recipe", recipe, "--out", str(out), "--no-eval", "--nproc", str(nproc),
           *(["--num-samples", str(num_samples)] if num_samples else [])]
    before, load0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), _load_avg(), time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"ranks": nproc, "threads_per_rank": threads, "halved_micro_batch": halved_micro_batch, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "load_before": load0, "load_after": _load_avg()}


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def held_out_ids(folder: Path, rows: int = 4, row_len: int = 512) -> torch.Tensor:
    """``rows x row_len`` tokens of a held-out English text (pydoc topics; calibration is not)."""
    import pydoc_data.topics
    from transformers import AutoTokenizer

    text = "\n\n".join(list(pydoc_data.topics.topics.values())[-20:])
    ids = AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt")["input_ids"][0]
    return ids[:rows * row_len].reshape(rows, row_len)


def float_log_probs(model: str | None, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    from quantkit.inputs.embedded_model import default_model_dir

    m = AutoModelForCausalLM.from_pretrained(model or default_model_dir(), dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(m(ids).logits.float(), -1)


def quality(folder: Path, ids: torch.Tensor, ref_log_probs: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """Perplexity on ``ids`` and mean KL(float || quantized) per position; and the logits."""
    import quantkit

    model = quantkit.load(folder)
    with torch.no_grad():
        logits = model(ids).logits.float()
    lp = torch.log_softmax(logits, -1)
    ppl = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).exp()
    kl = (ref_log_probs.exp() * (ref_log_probs - lp)).sum(-1).mean()
    return {"ppl": round(float(ppl), 4), "kl": round(float(kl), 5)}, logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--recipe", default="w4a16-g64-gptq")
    ap.add_argument("--num-samples", type=int, default=None, help="calibration samples (default: the recipe's)")
    ap.add_argument("--cpus", default="0,1", help="the two cores both runs are pinned to")
    ap.add_argument("--spread", action="store_true",
                    help="also 1 rank x 1 thread with halved micro-batches: the spread of one process")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    runs = {"one_rank": dict(threads=2, nproc=1, cpus=args.cpus), "two_ranks": dict(threads=1, nproc=2, cpus=args.cpus)}
    if args.spread:
        runs["one_rank_regrouped"] = dict(threads=1, nproc=1, cpus=args.cpus.split(",")[-1], halved_micro_batch=True)
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        timing = {k: convert(args.model, args.recipe, Path(tmp) / k, num_samples=args.num_samples, **kw)
                  for k, kw in runs.items()}
        ids = held_out_ids(Path(tmp) / "one_rank")
        ref = float_log_probs(args.model, ids)
        qual, logits = {}, {}
        for k in runs:
            qual[k], logits[k] = quality(Path(tmp) / k, ids, ref)
        ref_tensors = tensors(Path(tmp) / "one_rank")
        diffs = {k: checkpoint_difference(ref_tensors, tensors(Path(tmp) / k)) | {
                 "max_abs_logit_diff": round(float((logits["one_rank"] - logits[k]).abs().max()), 3)}
                 for k in runs if k != "one_rank"}
    violations = quality_violations(qual["one_rank"], qual["two_ranks"], diffs["two_ranks"])
    row = {"recipe": args.recipe, "num_samples": args.num_samples, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "held_out_tokens": ids.numel(), "runs": timing, "quality": qual, "difference": diffs,
           "tolerance": {"ppl_rtol": PPL_RTOL, "kl_rtol": KL_RTOL, "violations": violations}}
    if args.json:
        print(json.dumps(row))
    else:
        for k, r in timing.items():
            print(f"{k}: {r['ranks']} rank(s) x {r['threads_per_rank']} thread(s){', halved micro-batches' if r['halved_micro_batch'] else ''}: "
                  f"{r['wall_s']} s wall, {r['cpu_s']} s CPU (load {r['load_before']} -> {r['load_after']}); "
                  f"held-out ppl {qual[k]['ppl']}, KL to float {qual[k]['kl']}")
        print(f"wall: 2 ranks x 1 thread {timing['two_ranks']['wall_s']} s vs 1 rank x 2 threads "
              f"{timing['one_rank']['wall_s']} s (1 rank's wall / 2 ranks' = {timing['one_rank']['wall_s'] / timing['two_ranks']['wall_s']:.2f})")
        for k, d in diffs.items():
            print(f"{k} vs one_rank: codes differing {d['differing_codes']} of {d['codes']} ({d['code_share']:.2%}), "
                  f"max step {d['max_code_step']}; scales max rel diff {d['scale_rtol']:.2e}; "
                  f"other tensors not bit-identical: {d['other'] or 'none'}; max |logit diff| {d['max_abs_logit_diff']}")
        print(f"tolerance (other tensors bit-identical, ppl within {PPL_RTOL:.0%}, KL within {KL_RTOL:.0%} of 1 rank's): "
              + ("holds" if not violations else "does not hold: " + "; ".join(violations)))
    sys.exit(1 if violations else 0)


if __name__ == "__main__":
    main()
