"""Benchmark: what a narrow calibration set (one task, chat only) costs a low-bit model on the
default evaluation suite, against the sampler's traffic sample of the same log.

    python benchmarks/narrow_calibration.py [--log default|second] [--sets traffic,one-task,chat-only]
        [--formats w4a16,nvfp4a16,mxfp4a16] [--samples 128] [--json OUT.jsonl]
    python benchmarks/narrow_calibration.py --report OUT.jsonl [OUT2.jsonl ...]

Calibration sets, each ``--samples`` rows of at most 512 tokens drawn by the sampler
(``quantkit.calibration.calibrate``, policy ``traffic``, the seed given):

- ``traffic``: the whole log (``default``: the embedded default log ``calibration/default.jsonl``,
  8 tasks; ``second``: ``calibration_fidelity.py``'s classification-dominated traffic log);
- ``one-task``: the log's ``classification`` rows only (what a team calibrating its classifier
  gives);
- ``chat-only``: the log's ``chat`` rows only (the default log only);
- ``one-task+genericNN``: the one-task set with NN% of its rows replaced by windows of generic
  English text (``calibration_fidelity.generic_documents``: kernel documentation none of the
  log's rows comes from).

Formats, each by its GPTQ recipe: ``w4a16`` (``w4a16-g64-gptq``, the main job's recipe),
``nvfp4a16`` (``nvfp4a16-gptq``), ``mxfp4a16`` (``mxfp4a16`` with ``nvfp4a16-gptq``'s algorithm and
act-order "weight": ``formats.py``'s ``mxfp4a16-gptq-actorder``). Model: SmolLM2-135M (the
embedded default). Each checkpoint is scored on the default suite (``load_suite("default")``)
with the default ``SuiteOptions`` (``--text-items``, ``--mc-items`` and ``--max-len`` make it
smaller) except that nothing is generated (no greedy agreement, no
extraction or code items): the baseline's body runs once per batch for every cell of a process
(``calibration_fidelity.remember_body``), which holds for teacher-forced batches only. Each JSON
line keeps per slice mean KL, top-1 agreement and perplexity increase, the verdict (decision and
per-slice levels) and the set's coverage as the sampler reported it (its manifest's task shares
and warnings).

``--report`` prints per format and slice each set's mean KL (top-1 agreement) and the verdict.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import calibration_fidelity as fidelity  # noqa: E402

ROOT = HERE.parent
CACHE = ROOT / ".cache" / "benchmarks" / "narrow-calibration"
ONE_TASK = "classification"
SETS = ("traffic", "one-task", "chat-only")
FORMATS = {"w4a16": "w4a16-g64-gptq", "nvfp4a16": "nvfp4a16-gptq", "mxfp4a16": "mxfp4a16-gptq-actorder"}
MAX_LEN = 512


def source_log(log: str) -> Path:
    """The traffic log a set is drawn from."""
    if log == "default":
        return ROOT / "calibration" / "default.jsonl"
    return fidelity.build_logs("second")["traffic"]


def task_log(log: str, task: str) -> Path:
    """``log``'s rows labelled ``task``, as a log of their own (built once)."""
    out = CACHE / log / f"{task}.jsonl"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        keep = []
        for line in source_log(log).read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("task") == task:
                keep.append(line)
        out.write_text("\n".join(keep) + "\n", encoding="utf-8")
    return out


def coverage(manifest: dict) -> dict:
    """What the sampler said about a set: its sample's task shares, the effective number of task
    types (exp of their Shannon entropy) and its warnings."""
    shares = {t["name"]: t["sample_share"] for t in manifest["tasks"] if t["selected"]}
    entropy = -sum(p * math.log(p) for p in shares.values() if p > 0)
    return {"sample_tasks": shares, "effective_tasks": round(math.exp(entropy), 3),
            "log_tasks": len(manifest["tasks"]), "warnings": manifest["warnings"]}


def calibration_set(name: str, log: str, tok, n: int, seed: int) -> tuple[list[list[int]], dict]:
    """Token ids of one set and its coverage."""
    from quantkit.calibration.calibration_set import calibrate

    base, _, mixed = name.partition("+generic")
    path = {"traffic": source_log(log), "one-task": task_log(log, ONE_TASK),
            "chat-only": task_log(log, "chat")}.get(base)
    if path is None:
        raise SystemExit(f"--sets: unknown set {name!r} (expected {', '.join(SETS)} or one-task+genericNN)")
    res = calibrate(path, tok, num_samples=n, max_len=MAX_LEN, seed=seed)
    ids, cov = res.input_ids, coverage(res.manifest)
    if mixed:
        k = round(n * int(mixed) / 100)
        generic = CACHE / "generic.json"
        if not generic.exists():
            generic.parent.mkdir(parents=True, exist_ok=True)
            docs = fidelity.generic_documents(CACHE, fidelity.default_rows())
            generic.write_text(json.dumps(docs, ensure_ascii=False), encoding="utf-8")
        windows, _ = fidelity.calibration_ids("generic", seed, {"generic": generic}, tok, k, MAX_LEN)
        keep = sorted(random.Random(seed).sample(range(len(ids)), n - k))
        ids = [ids[i] for i in keep] + windows
        cov["generic_rows"] = k
    return ids, cov


def recipe_for(fmt: str, samples: int):
    import formats

    from quantkit.recipe import load_recipe

    return load_recipe(formats.recipe_of(FORMATS[fmt], samples, MAX_LEN))


def run(args) -> None:
    import torch

    import quantkit
    from quantkit.evaluation import SuiteOptions, evaluate, load_suite
    from quantkit.evaluation.checkpoint import load_model, load_tokenizer
    from quantkit.inputs.embedded_model import default_model_dir

    folder = default_model_dir()
    tok = load_tokenizer(folder)
    base = fidelity.remember_body(load_model(folder))
    suite = load_suite("default")
    opts = SuiteOptions(gen_prompts=0, extract_items=0, code_items=0, text_items=args.text_items,
                        mc_items=args.mc_items)
    machine = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
               "torch": torch.__version__, "affinity": sorted(os.sched_getaffinity(0))}
    say = lambda m: print(m, file=sys.stderr, flush=True)   # noqa: E731
    for fmt, name in cells(args):
        ids, cov = calibration_set(name, args.log, tok, args.samples, args.seed)
        row = {"log": args.log, "set": name, "format": fmt, "recipe": FORMATS[fmt], "seed": args.seed,
               "suite": {"text_items": args.text_items, "mc_items": args.mc_items, "max_len": args.max_len},
               "samples": len(ids), "sample_tokens": sum(map(len, ids)), "coverage": cov, "machine": machine}
        with tempfile.TemporaryDirectory(dir=ROOT / ".cache") as tmp:
            c0 = time.process_time()
            q = quantkit.quantize(folder, recipe_for(fmt, len(ids)), ids,
                                  quantkit.ConvertOptions(out=Path(tmp) / "ckpt", log=say))
            path = q.save()
            row["convert_cpu_s"] = round(time.process_time() - c0, 1)
            cand = load_model(path)
            c0 = time.process_time()
            result = evaluate(base, cand, tok, suite=suite, max_len=args.max_len, options=opts, progress=False)
            row["eval_cpu_s"] = round(time.process_time() - c0, 1)
        row["slices"] = {s: {k: v[k] for k in ("kl_mean", "top1_agreement", "ppl_increase") if k in v}
                         for s, v in result.slices.items()}
        row["verdict"] = {"decision": result.verdict.decision, "slices": result.verdict.slices,
                          "reasons": [r.text() for r in result.verdict.reasons]}
        if args.json:
            with args.json.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        say(f"{fmt} {name}: {row['verdict']['decision']}, mean KL {mean_kl(row):.4f}")


def mean_kl(row: dict) -> float:
    """Mean KL over the slices that measure it (a multiple-choice slice, knowledge-en, does not)."""
    kls = [v["kl_mean"] for v in row["slices"].values() if "kl_mean" in v]
    return sum(kls) / len(kls)


def cells(args) -> list[tuple[str, str]]:
    """(format, set) in the order to run them: ``--cells FORMAT:SET,...`` as given, else every set
    for each format."""
    if args.cells:
        return [tuple(c.split(":", 1)) for c in args.cells.split(",")]
    return [(f, s) for f in args.formats.split(",") for s in args.sets.split(",")]


def _cell(row: dict, s: str) -> str:
    v = row["slices"].get(s, {})
    shown = f"{v['kl_mean']:.4f} ({v.get('top1_agreement', float('nan')):.3f})" if "kl_mean" in v else "n/a"
    return f"{shown} {row['verdict']['slices'].get(s, '')}"


def report(files: list[Path]) -> None:
    runs: dict[tuple[str, str], dict[str, dict]] = {}
    for f in files:
        for line in f.read_text(encoding="utf-8").splitlines():
            if line.strip():
                r = json.loads(line)
                runs.setdefault((r["log"], r["format"]), {})[r["set"]] = r
    for (log, fmt), by_set in sorted(runs.items()):
        names = [s for s in sorted(by_set, key=lambda s: (s != "traffic", s))]
        slices = list(next(iter(by_set.values()))["slices"])
        print(f"### {FORMATS[fmt]} on log {log}: mean KL (top-1 agreement), verdict per slice\n")
        print("| slice | " + " | ".join(names) + " |")
        print("| --- |" + " --- |" * len(names))
        for s in slices:
            print(f"| {s} | " + " | ".join(_cell(by_set[n], s) for n in names) + " |")
        means = {n: mean_kl(by_set[n]) for n in names}
        print("| **mean over slices** | " + " | ".join(
            f"**{means[n]:.4f}** ({means[n] / means['traffic']:.2f}x)" if "traffic" in means else f"**{means[n]:.4f}**"
            for n in names) + " |")
        print("| verdict | " + " | ".join(by_set[n]["verdict"]["decision"] for n in names) + " |")
        print("| effective task types (log's tasks) | " + " | ".join(
            f"{by_set[n]['coverage']['effective_tasks']:.2f} ({by_set[n]['coverage']['log_tasks']})" for n in names)
            + " |")
        print("| convert / eval CPU s | " + " | ".join(
            f"{by_set[n]['convert_cpu_s']:.0f} / {by_set[n]['eval_cpu_s']:.0f}" for n in names) + " |\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", default="default", choices=("default", "second"))
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--cells", default="", help="FORMAT:SET,... to run in this order (overrides --sets/--formats)")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text-items", type=int, default=12, help="SuiteOptions.text_items (the default suite's 12)")
    ap.add_argument("--mc-items", type=int, default=48, help="SuiteOptions.mc_items (the default suite's 48)")
    ap.add_argument("--max-len", type=int, default=2048, help="the evaluation's max_len (long slices' length)")
    ap.add_argument("--json", type=Path, default=None, help="append one JSON line per conversion")
    ap.add_argument("--report", type=Path, nargs="+", default=None)
    args = ap.parse_args()
    if args.report:
        report(args.report)
    else:
        run(args)


if __name__ == "__main__":
    main()
