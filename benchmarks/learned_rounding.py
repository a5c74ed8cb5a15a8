"""Learned rounding benchmark: SmolLM2's held-out perplexity and the conversion's CPU seconds under
round to nearest, GPTQ and learned rounding (its default and fast presets), per weight format.

Data: the held-out and calibration windows of ``benchmarks/gptq.py`` (the Lee corpus: its first
``--eval-windows`` windows of ``--seq-len`` tokens for perplexity, ``--samples`` windows at seeded
offsets in the rest for calibration); every method of a format gets the same rows. CPU seconds are
the process's CPU time over ``quantkit.quantize`` (user + system, every thread), so a loaded
shared host inflates them less than wall time; run with ``--threads 1`` to compare.

Formats: ``w4a16-g64`` (int4 symmetric, groups of 64: SmolLM2's 576 is not a multiple of 128),
``nvfp4a16``, ``mxfp4a16``. Methods: ``rtn``; ``gptq`` with the shipped GPTQ recipes' settings
(act-order "weight", and ``mse`` ranges for int); ``learned`` (200 steps) and ``learned-fast``
(50 steps). A run is ``FORMAT:METHOD``; each run is independent, so runs can go in parallel
processes and their JSON lines be joined.

Usage:
    python benchmarks/learned_rounding.py --threads 1 --only w4a16-g64:rtn,w4a16-g64:learned-fast
    python benchmarks/learned_rounding.py --threads 1 --json out.json     # every run, one after another
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
INT4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 64}
#: format -> (weights of its config group, what its GPTQ run adds to them)
FORMATS = {"w4a16-g64": (INT4, {"actorder": "weight", "observer": "mse"}),
           "nvfp4a16": ("NVFP4A16", {"actorder": "weight"}),
           "mxfp4a16": ("MXFP4A16", {"actorder": "weight"})}
METHODS = {"rtn": {"name": "rtn"},
           "gptq": {"name": "gptq", "block_size": 128, "dampening_frac": 0.01},
           "learned": {"name": "learned_rounding"},
           "learned-fast": {"name": "learned_rounding", "preset": "fast"}}


def recipe_of(run: str, samples: int, seq_len: int, learned_batch: int | None = None,
              layers: int | None = None) -> dict:
    """The recipe of ``FORMAT:METHOD`` (``learned_batch``: learned rounding's rows per step, when
    not its preset's; ``layers``: only the first decoder layers quantized, the rest ignored)."""
    from quantkit.config.scheme import PRESETS

    fmt, method = run.split(":")
    weights, gptq_extra = FORMATS[fmt]
    if isinstance(weights, str):
        weights = {k: v for k, v in PRESETS[weights].weights.to_dict().items() if k != "observer_kwargs"}
    if method == "gptq":
        weights = {**weights, **gptq_extra}
    algorithm = dict(METHODS[method])
    if learned_batch and algorithm["name"] == "learned_rounding":
        algorithm["batch_size"] = learned_batch
    ignore = ["lm_head"]
    if layers is not None:
        ignore.append(rf"re:model\.layers\.(?!(?:{'|'.join(str(i) for i in range(layers))})\.)")
    return {"version": 1, "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}},
            "ignore": ignore, "algorithm": algorithm,
            "calibration": {"num_samples": samples, "max_seq_len": seq_len}}


def measure(run: str, folder: Path, held: list, calib: list, bos, workdir: Path, a: argparse.Namespace) -> dict:
    import quantkit
    from gptq import perplexity
    from transformers import AutoModelForCausalLM

    if run == "fp32":
        return {"perplexity": perplexity(AutoModelForCausalLM.from_pretrained(folder), held, bos)}
    recipe = quantkit.load_recipe(recipe_of(run, len(calib), a.seq_len, a.learned_batch, a.layers))
    cpu, wall = time.process_time(), time.perf_counter()
    q = quantkit.quantize(folder, recipe, calib if recipe.needs_calibration else None,
                          quantkit.ConvertOptions(workdir=str(workdir / run.replace(":", "-"))))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {"perplexity": perplexity(q.load(), held, bos), "cpu_seconds": round(cpu, 1), "wall_seconds": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=32, help="calibration windows")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--learned-batch", type=int, help="learned rounding's calibration rows per step (default: "
                    "its preset's, 8); fewer rows cost proportionally less CPU per step")
    ap.add_argument("--layers", type=int, help="quantize only the first N decoder layers (the rest stay float): "
                    "a cheaper comparison of the methods on the same layers")
    ap.add_argument("--only", help="comma-separated runs: fp32 or FORMAT:METHOD "
                    f"(formats {', '.join(FORMATS)}; methods {', '.join(METHODS)})")
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args()
    runs = a.only.split(",") if a.only else ["fp32", *(f"{f}:{m}" for f in FORMATS for m in METHODS)]
    bad = [r for r in runs if r != "fp32" and (r.count(":") != 1 or r.split(":")[0] not in FORMATS
                                               or r.split(":")[1] not in METHODS)]
    if bad:
        ap.error(f"--only: unknown run '{bad[0]}' (fp32 or FORMAT:METHOD)")

    import torch

    sys.path.insert(0, str(HERE.parent))
    from gptq import heldout_and_calibration, load_tokenizer, model_dir

    torch.set_num_threads(a.threads)
    folder = model_dir("smollm2")
    held, calib, bos = heldout_and_calibration(load_tokenizer(folder), a.eval_windows, a.seq_len, a.samples, a.seed)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            results[run] = measure(run, folder, held, calib, bos, Path(tmp), a)
            print(json.dumps({"run": run, **results[run]}), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": results}, indent=2))


if __name__ == "__main__":
    main()
