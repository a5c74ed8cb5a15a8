"""Number formats benchmark: held-out perplexity of SmolLM2 (or ``--model gemma3``) under FP8 blocks, MXFP8, W4AFP8,
W4A8 and 3-bit weights, RTN and GPTQ, read back through ``quantkit.load`` (the torch reference
path, activations quantized as each scheme says).

Data: the held-out and calibration windows of ``benchmarks/gptq.py`` (the Lee corpus from the
gensim wheel: its first ``--eval-windows`` windows of ``--seq-len`` tokens for perplexity,
``--samples`` windows at seeded offsets in the rest of it for GPTQ's calibration).

SmolLM2's widths (576) are not multiples of 128, so the 128-wide presets run here with 64:
FP8 blocks of 64 x 64 with activation groups of 64, and int4 / int3 groups of 64. Every GPTQ
run uses the shipped GPTQ recipes' settings (act-order "weight", ``mse`` ranges, true-sequential).

``w4a16-g64-gptaq`` is ``w4a16-g64-gptq`` with GPTAQ on (``algorithm: {gptaq: true}``; the shipped
``nvfp4a16-gptaq`` is ``nvfp4a16-gptq-actorder`` with it). Each run reports its quantization's wall
and CPU seconds (``quantize_cpu_seconds``: the process's, every thread).

A label may also be a shipped recipe's name (``nvfp4a16``). An FP4 RTN recipe's name with ``-gptq``
after it (``mxfp4a16-gptq``, ``nvfp4a16-gptq``) runs GPTQ with ``nvfp4a16-gptq``'s block and damping
in column order, with ``-gptq-actorder`` after it with act-order "weight" (what the shipped
``nvfp4a16-gptq`` recipe does); and ``+rot`` after a label puts the
``rotate`` step (transforms/rotate.py: residual and value/output Hadamard rotations) first, and
``+roth`` the value/output rotation alone (the one Gemma3 takes). ``llmc:`` before a label
without rotation runs llm-compressor 0.14 on the same scheme instead (``QuantizationModifier``,
or ``GPTQModifier`` for a GPTQ label, with the same calibration windows), in its own interpreter
(``--llmc-python``, default ``.venv-llmc``), and scores its model as ``oneshot`` leaves it.
llm-compressor pins other versions than quantkit, so it lives in its own venv::

    python3 -m venv .venv-llmc
    .venv-llmc/bin/pip install "llmcompressor==0.14.0.1" "torch==2.13.0" -c constraints-cpu.txt
    .venv-llmc/bin/pip uninstall -y torchvision torchaudio torchcodec   # PyPI builds break transformers

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
NVFP4 = {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16}
IMATRIX = "imatrix_mse"


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
    "w4a16-g64-gptaq": (_group(dict(INT4, **GPTQ_WEIGHTS)), {"name": "gptq", "gptaq": True}),
    "w3a16-g64": (_group(INT3), "rtn"),
    "w3a16-g64-gptq": (_group(dict(INT3, **GPTQ_WEIGHTS)), "gptq"),
    # importance-weighted ranges (observer imatrix_mse): against min-max / mse RTN and the shipped GPTQ
    "w4a16-g64-mse": (_group(dict(INT4, observer="mse")), "rtn"),
    "w4a16-g64-imatrix": (_group(dict(INT4, observer=IMATRIX)), "rtn"),
    "w4a16-g64-gptq-imatrix": (_group(dict(INT4, **dict(GPTQ_WEIGHTS, observer=IMATRIX))), "gptq"),
    "nvfp4a16-imatrix": (_group(dict(NVFP4, observer=IMATRIX)), "rtn"),
    "nvfp4a16-gptq-imatrix": (_group(dict(NVFP4, actorder="weight", observer=IMATRIX)), "gptq"),
}


RECIPES = HERE.parent.parent / "recipes"
#: shipped FP4 recipes that take ``-gptq`` after their name (GPTQ with ``nvfp4a16-gptq``'s settings),
#: or ``-gptq-actorder`` (the same with act-order "weight")
FP4_RECIPES = ("nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16")

#: label suffix -> the rotate step it puts first; Gemma3 and MoE models take only the head rotation
ROTATIONS = {"rot": "rotate", "roth": {"rotate": {"residual": False}}}


def recipe_of(label: str, samples: int, seq_len: int) -> dict:
    """The recipe a run label names: one of ``RUNS``, or a shipped recipe (``recipes/NAME.yaml``);
    ``+rot`` after it puts the ``rotate`` step (residual and heads) first in its chain, ``+roth`` the
    head rotation alone."""
    import yaml

    name, _, rotation = label.partition("+")
    base = name.removesuffix("-actorder").removesuffix("-gptq")
    if name in RUNS:
        groups, algorithm = RUNS[name]
        recipe = {"version": 1, "config_groups": groups, "ignore": ["lm_head"],
                  "algorithm": algorithm if isinstance(algorithm, dict) else {"name": algorithm}}
    elif base in FP4_RECIPES and base != name:   # FP4 by GPTQ, in column order or with act-order "weight"
        recipe = yaml.safe_load((RECIPES / f"{base}.yaml").read_text())
        recipe["algorithm"] = yaml.safe_load((RECIPES / "nvfp4a16-gptq.yaml").read_text())["algorithm"]
        if name.endswith("-actorder"):
            recipe["config_groups"] = {"group_0": _actorder_group(recipe.pop("scheme"))}
    else:
        recipe = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())
    recipe["calibration"] = {"num_samples": samples, "max_seq_len": seq_len}
    if rotation:
        algorithm = recipe.pop("algorithm", None)
        if isinstance(algorithm, dict):   # the one-step form, options kept
            algorithm = {algorithm["name"]: {k: v for k, v in algorithm.items() if k != "name"}}
        steps = recipe.pop("steps", None) or [algorithm]
        recipe["steps"] = [ROTATIONS[rotation], *steps]
    return recipe


def llmc_spec(label: str) -> dict:
    """What llm-compressor runs for ``llmc:<label>``: the same scheme (a preset name, or RUNS'
    config groups, which are compressed-tensors' own dicts), round to nearest or its GPTQ."""
    import yaml

    name = label.removeprefix("llmc:")
    if name == "mxfp8":   # compressed-tensors' own preset: its E8M0 scale spelling is its own
        return {"scheme": "MXFP8", "gptq": False}
    if name in RUNS:
        groups, algorithm = RUNS[name]
        return {"config_groups": groups, "gptq": algorithm == "gptq"}
    gptq = name.endswith("-gptq")
    recipe = yaml.safe_load((RECIPES / f"{name.removesuffix('-gptq')}.yaml").read_text())
    return {"scheme": recipe["scheme"], "gptq": gptq}


def worker_llmc(spec: dict) -> dict:
    """llm-compressor (its own interpreter: it pins other versions) on the scheme ``llmc_spec``
    gives; perplexity of its model as it leaves ``oneshot`` (weights quantized and dequantized,
    activations quantized by compressed-tensors' forward as the scheme says)."""
    import torch
    from datasets import Dataset
    from gptq import perplexity
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    scheme = {"scheme": spec["scheme"]} if "scheme" in spec else {"config_groups": spec["config_groups"]}
    t0 = time.perf_counter()
    if spec["gptq"]:
        modifier = GPTQModifier(**scheme, ignore=["lm_head"], block_size=128, dampening_frac=0.01)
    else:
        modifier = QuantizationModifier(**scheme, ignore=["lm_head"])
    if spec["calibrate"]:   # GPTQ, and static scales (NVFP4's global input scale)
        calib = spec["calibration"]
        ds = Dataset.from_dict({"input_ids": calib, "attention_mask": [[1] * len(c) for c in calib]})
        oneshot(model=model, dataset=ds, recipe=modifier, max_seq_length=spec["seq_len"],
                num_calibration_samples=len(calib), shuffle_calibration_samples=False)
    else:
        oneshot(model=model, recipe=modifier)
    seconds = time.perf_counter() - t0
    return {"perplexity": perplexity(model, spec["eval"], spec["bos"]), "quantize_seconds": round(seconds, 1)}


def run_llmc(python: str, label: str, folder: Path, held: list, calib: list, bos, seq_len: int, threads: int) -> dict:
    import os
    import subprocess

    import quantkit

    ours = quantkit.load_recipe(recipe_of(label.removeprefix("llmc:"), len(calib), seq_len))
    spec = {**llmc_spec(label), "calibrate": ours.needs_calibration, "model_dir": str(folder), "eval": held, "calibration": calib, "bos": bos,
            "seq_len": seq_len, "threads": threads}
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, PYTHONPATH=str(HERE.parent), TOKENIZERS_PARALLELISM="false")
        proc = subprocess.run([python, str(HERE), "--worker", str(spec_path), str(result_path)],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}"}
        return json.loads(result_path.read_text())


def _actorder_group(preset: str) -> dict:
    """A preset's config group with act-order "weight" on its weights."""
    from quantkit.config.scheme import PRESETS

    d = PRESETS[preset].to_dict()
    def args(a: dict | None, drop: tuple = ()) -> dict | None:
        return None if a is None else {k: v for k, v in a.items() if k not in ("observer_kwargs", *drop)}
    return {"targets": d["targets"], "weights": {**args(d["weights"]), "actorder": "weight"},
            "input_activations": args(d["input_activations"], ("observer",))}   # the recipe's own choice


def known(label: str) -> bool:
    if label.startswith("llmc:"):
        name = label.removeprefix("llmc:")
        return "+" not in name and (name in RUNS or (RECIPES / f"{name.removesuffix('-gptq')}.yaml").is_file())
    name, _, rotation = label.partition("+")
    if rotation and rotation not in ROTATIONS:
        return False
    fp4_by_gptq = name.removesuffix("-actorder").endswith("-gptq") and \
        name.removesuffix("-actorder").removesuffix("-gptq") in FP4_RECIPES
    return label == "fp32" or name in RUNS or (RECIPES / f"{name}.yaml").is_file() or fp4_by_gptq


def measure(label: str, folder: Path, held: list, calib: list, bos, workdir: Path, seq_len: int) -> dict:
    import quantkit
    from gptq import perplexity
    from transformers import AutoModelForCausalLM

    if label == "fp32":
        return {"perplexity": perplexity(AutoModelForCausalLM.from_pretrained(folder), held, bos)}
    recipe = quantkit.load_recipe(recipe_of(label, len(calib), seq_len))
    t0, c0 = time.perf_counter(), time.process_time()
    q = quantkit.quantize(folder, recipe, calib if recipe.needs_calibration else None,
                          quantkit.ConvertOptions(workdir=str(workdir / label.replace("+", "-"))))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"perplexity": perplexity(q.load(), held, bos), "quantize_seconds": round(seconds, 1),
            "quantize_cpu_seconds": round(cpu, 1)}


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
    ap.add_argument("--llmc-python", default=str(HERE.parent.parent / ".venv-llmc" / "bin" / "python"),
                    help="the interpreter with llmcompressor, for llmc: labels")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        spec_path, result_path = a.worker
        Path(result_path).write_text(json.dumps(worker_llmc(json.loads(Path(spec_path).read_text()))))
        return

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
                 "each may end in +rot or +roth, or start with llmc: for llm-compressor's run of it)")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label in labels:
            if label.startswith("llmc:"):
                results[label] = run_llmc(a.llmc_python, label, folder, held, calib, bos, a.seq_len, a.threads)
            else:
                results[label] = measure(label, folder, held, calib, bos, Path(tmp), a.seq_len)
            print(label, json.dumps(results[label]), flush=True)
    base = results.get("fp32", {}).get("perplexity")
    print("\n| run | perplexity | vs fp32 |\n| --- | --- | --- |")
    for label, r in results.items():
        if "error" in r:
            print(f"| {label} | error: {r['error'][-300:]!r} | |")
            continue
        vs = f"{(r['perplexity'] / base - 1) * 100:+.2f}%" if base and label != "fp32" else ""
        print(f"| {label} | {r['perplexity']:.3f} | {vs} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": results}, indent=2))


if __name__ == "__main__":
    main()
