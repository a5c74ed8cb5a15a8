"""Number formats benchmark: held-out perplexity of SmolLM2 (or ``--model gemma3``) under FP8 blocks, MXFP8, W4AFP8,
W4A8 and 3-bit weights, RTN and GPTQ, read back through ``quantkit.load`` (the torch reference
path, activations quantized as each scheme says).

Data: the held-out and calibration windows of ``benchmarks/gptq.py`` (the Lee corpus from the
gensim wheel: its first ``--eval-windows`` windows of ``--seq-len`` tokens for perplexity,
``--samples`` windows at seeded offsets in the rest of it for GPTQ's calibration).

SmolLM2's widths (576) are not multiples of 128, so the 128-wide presets run here with 64:
FP8 blocks of 64 x 64 with activation groups of 64, and int4 / int3 groups of 64. Every GPTQ
run uses the shipped GPTQ recipes' settings (act-order "weight", ``mse`` ranges, true-sequential).

A label may also be a shipped recipe's name (``nvfp4a16``; an FP4 one with ``-gptq`` after it,
``mxfp4a16-gptq``, runs GPTQ with ``nvfp4a16-gptq``'s settings), and ``+rot`` after a label puts the
``rotate`` step (transforms/rotate.py: residual and value/output Hadamard rotations) first, and
``+roth`` the value/output rotation alone (the one Gemma3 takes).

Usage:
    python benchmarks/formats.py --samples 32 --eval-windows 20
    python benchmarks/formats.py --only fp32,w4a16-g64,w4a16-g64+rot,nvfp4a16,nvfp4a16+rot
    python benchmarks/formats.py --model gemma3 --only fp32,nvfp4a16,nvfp4a16-gptq
    python benchmarks/formats.py --only fp32,mxfp8,w3a16-g64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
FP8 = {"num_bits": 8, "type": "float", "symmetric": True}
INT4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 64}
INT3 = dict(INT4, num_bits=3)
GPTQ_WEIGHTS = {"actorder": "weight", "observer": "mse"}


def _group(weights: dict, acts: dict | None = None) -> dict:
    return {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts}}


#: run label -> (config group, algorithm)
RUNS = {
    "fp8-block-64": (_group(dict(FP8, strategy="block", block_structure=[64, 64]),
                            dict(FP8, strategy="group", group_size=64, dynamic=True)), "rtn"),
    "mxfp8": (_group(dict(FP8, strategy="group", group_size=32, scale_dtype="torch.uint8"),
                     dict(FP8, strategy="group", group_size=32, dynamic=True, scale_dtype="torch.uint8")), "rtn"),
    "w4afp8-g64": (_group(INT4, dict(FP8, strategy="token", dynamic=True)), "rtn"),
    "w4afp8-g64-gptq": (_group(dict(INT4, **GPTQ_WEIGHTS), dict(FP8, strategy="token", dynamic=True)), "gptq"),
    "w4a8-g64": (_group(INT4, {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}), "rtn"),
    "w4a8-g64-gptq": (_group(dict(INT4, **GPTQ_WEIGHTS),
                             {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True}), "gptq"),
    "w4a16-g64": (_group(INT4), "rtn"),
    "w4a16-g64-gptq": (_group(dict(INT4, **GPTQ_WEIGHTS)), "gptq"),
    "w3a16-g64": (_group(INT3), "rtn"),
    "w3a16-g64-gptq": (_group(dict(INT3, **GPTQ_WEIGHTS)), "gptq"),
}


RECIPES = HERE.parent.parent / "recipes"
#: shipped FP4 recipes that take ``-gptq`` after their name (GPTQ with ``nvfp4a16-gptq``'s settings)
FP4_RECIPES = ("nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16")

#: label suffix -> the rotate step it puts first; Gemma3 and MoE models take only the head rotation
ROTATIONS = {"rot": "rotate", "roth": {"rotate": {"residual": False}}}


def recipe_of(label: str, samples: int, seq_len: int) -> dict:
    """The recipe a run label names: one of ``RUNS``, or a shipped recipe (``recipes/NAME.yaml``);
    ``+rot`` after it puts the ``rotate`` step (residual and heads) first in its chain, ``+roth`` the
    head rotation alone."""
    import yaml

    name, _, rotation = label.partition("+")
    if name in RUNS:
        groups, algorithm = RUNS[name]
        recipe = {"version": 1, "config_groups": groups, "ignore": ["lm_head"], "algorithm": {"name": algorithm}}
    elif (RECIPES / f"{name}.yaml").is_file():
        recipe = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())
    else:   # an FP4 recipe by GPTQ, with nvfp4a16-gptq's settings
        recipe = yaml.safe_load((RECIPES / f"{name.removesuffix('-gptq')}.yaml").read_text())
        recipe["algorithm"] = yaml.safe_load((RECIPES / "nvfp4a16-gptq.yaml").read_text())["algorithm"]
    recipe["calibration"] = {"num_samples": samples, "max_seq_len": seq_len}
    if rotation:
        algorithm = recipe.pop("algorithm", None)
        if isinstance(algorithm, dict):   # the one-step form, options kept
            algorithm = {algorithm["name"]: {k: v for k, v in algorithm.items() if k != "name"}}
        steps = recipe.pop("steps", None) or [algorithm]
        recipe["steps"] = [ROTATIONS[rotation], *steps]
    return recipe


def known(label: str) -> bool:
    name, _, rotation = label.partition("+")
    if rotation and rotation not in ROTATIONS:
        return False
    fp4_by_gptq = name.endswith("-gptq") and name.removesuffix("-gptq") in FP4_RECIPES
    return label == "fp32" or name in RUNS or (RECIPES / f"{name}.yaml").is_file() or fp4_by_gptq


def measure(label: str, folder: Path, held: list, calib: list, bos, workdir: Path, seq_len: int) -> dict:
    import quantkit
    from gptq import perplexity
    from transformers import AutoModelForCausalLM

    if label == "fp32":
        return {"perplexity": perplexity(AutoModelForCausalLM.from_pretrained(folder), held, bos)}
    recipe = quantkit.load_recipe(recipe_of(label, len(calib), seq_len))
    t0 = time.perf_counter()
    q = quantkit.quantize(folder, recipe, calib if recipe.needs_calibration else None,
                          quantkit.ConvertOptions(workdir=str(workdir / label.replace("+", "-"))))
    seconds = time.perf_counter() - t0
    return {"perplexity": perplexity(q.load(), held, bos), "quantize_seconds": round(seconds, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3, or a local HF folder")
    ap.add_argument("--samples", type=int, default=32, help="GPTQ calibration windows")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", help="comma-separated run labels: fp32, those of RUNS or a recipe name, each "
                    "optionally followed by +rot (the rotate step first) or +roth (its head rotation alone)")
    ap.add_argument("--json", help="write the figures to this file")
    a = ap.parse_args()

    import torch

    sys.path.insert(0, str(HERE.parent))
    from gptq import heldout_and_calibration, load_tokenizer, model_dir

    torch.set_num_threads(a.threads)
    folder = model_dir(a.model)
    held, calib, bos = heldout_and_calibration(load_tokenizer(folder), a.eval_windows, a.seq_len, a.samples, a.seed)
    labels = a.only.split(",") if a.only else ["fp32", *RUNS]
    unknown = [x for x in labels if not known(x)]
    if unknown:
        ap.error(f"--only: unknown run '{unknown[0]}' (known: fp32, {', '.join(RUNS)}, a recipe name; "
                 "each may end in +rot or +roth)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in labels:
            results[label] = measure(label, folder, held, calib, bos, Path(tmp), a.seq_len)
            print(label, json.dumps(results[label]), flush=True)
    base = results.get("fp32", {}).get("perplexity")
    print("\n| run | perplexity | vs fp32 |\n| --- | --- | --- |")
    for label, r in results.items():
        vs = f"{(r['perplexity'] / base - 1) * 100:+.2f}%" if base and label != "fp32" else ""
        print(f"| {label} | {r['perplexity']:.3f} | {vs} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": results}, indent=2))


if __name__ == "__main__":
    main()
