"""Benchmark: the integrity pass on clean checkpoints of real models (false alarms, time).

    taskset -c 0 env OMP_NUM_THREADS=1 python benchmarks/integrity.py --model smollm2 [--json smollm2.json]
    taskset -c 1 env OMP_NUM_THREADS=1 python benchmarks/integrity.py --model gemma3  [--json gemma3.json]
        [--recipes w8a16,w4a16-g64-gptq,...] [--out DIR] [--keep] [--threads 1] [--num-samples N]

For each shipped recipe (recipes/*.yaml: every one is a W4 or W8 scheme, RTN or GPTQ after
any transforms), converts the model (bundled calibration sample), runs the integrity pass
alone (``check_checkpoint``) on the written folder and prints: the pass's wall and CPU
seconds, the modules and tensors it flags under the default limits (acceptance 3: none), and
per measure the worst value with its module and the margin to the REVIEW limit. A recipe
whose group size does not divide the model's widths (g128 on SmolLM2's 576) is listed as
skipped. Each checkpoint is judged twice: as the pass judges it (every row against the
conversion's own row record) and without that record (round to nearest plus the quantizer's
allowance, what a checkpoint from another tool gets). ``--num-samples`` converts with fewer
calibration samples (the pass reads the files; GPTQ on less data only scatters more). SmolLM2's pass time is also given against the evaluation's own time on one core
(``EVAL_SECONDS``: W8A16, the full default suite, benchmarks/RESULTS.md; acceptance 2: at
most 10%). Checkpoints are deleted after their check unless ``--keep``. One JSON document
at the end (``--json`` writes it too).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

EVAL_SECONDS = 396.7   # `evaluate` wall s, SmolLM2 W8A16, default suite, one core (benchmarks/RESULTS.md)
MEASURES = ("recon_excess_db", "recon_unit_excess_db", "recon_gain_error", "tensor_problems", "tensor_rel_error")


def model_dir(name: str) -> Path:
    if name == "smollm2":
        from quantkit.inputs.embedded_model import default_model_dir
        return default_model_dir()
    if name == "gemma3":
        from gemma3 import gemma3_model_dir
        return gemma3_model_dir()
    return Path(name)


def worst(report) -> dict:
    """Per measure: the worst value over the checkpoint, where, and its margin to the REVIEW limit
    (dB measures: value - limit, > 0 is flagged; the others: value / limit, > 1 is flagged)."""
    from quantkit.evaluation.verdict import DEFAULT_LIMITS

    out = {}
    for name, values in report.measures().items():
        for m, v in values.items():
            if m not in out or v > out[m]["value"]:
                out[m] = {"value": v, "where": name.removeprefix("integrity:")}
    for m, w in out.items():
        review = DEFAULT_LIMITS[m].review
        w["review"] = review
        w["margin"] = w["value"] - review if m.endswith("_db") else (w["value"] / review if review else w["value"])
    return out


def recipe_with(name: str, num_samples: int | None) -> str | dict:
    """A shipped recipe, with fewer calibration samples when asked (the pass reads the files, not the data)."""
    if num_samples is None:
        return name
    import yaml
    doc = yaml.safe_load((ROOT / "recipes" / f"{name}.yaml").read_text())
    doc.setdefault("calibration", {})["num_samples"] = num_samples
    return doc


def check_one(base: Path, recipe: str, out_dir: Path, keep: bool, num_samples: int | None = None) -> dict:
    import quantkit
    from quantkit.errors import QuantkitError
    from quantkit.evaluation.eval_result import flagged_measures
    from quantkit.evaluation.integrity import check_checkpoint
    from quantkit.evaluation.verdict import Thresholds, decide

    ckpt = out_dir / recipe
    row: dict = {"recipe": recipe}
    t = time.perf_counter()
    try:
        if not (ckpt / "config.json").exists():
            quantkit.quantize(str(base), recipe_with(recipe, num_samples),
                              options=quantkit.ConvertOptions(workdir=out_dir)).save(ckpt, overwrite=True)
    except QuantkitError as e:
        return {**row, "skipped": str(e)}
    row["convert_s"] = time.perf_counter() - t
    t, c = time.perf_counter(), time.process_time()
    report = check_checkpoint(base, ckpt)
    row.update({"pass_s": time.perf_counter() - t, "pass_cpu_s": time.process_time() - c,
                "modules": len(report.modules), "transformed_layers": len(report.transformed),
                "fallback": report.fallback, "notes": report.notes[:5]})
    verdict = decide(flagged_measures(report, Thresholds()))
    row["decision"] = verdict.decision
    row["flagged"] = [r.text() for r in verdict.reasons]
    row["worst"] = worst(report)
    row["recorded_rows"] = sum(m.get("expected_from") == "rows" for m in report.modules.values())
    # the same files judged without the conversion's row record: what the allowances alone say
    bare = check_checkpoint(base, ckpt, use_record=False)
    bare_verdict = decide(flagged_measures(bare, Thresholds()))
    row["without_record"] = {"decision": bare_verdict.decision, "flagged": [r.text() for r in bare_verdict.reasons],
                             "worst": worst(bare)}
    if not keep:
        shutil.rmtree(ckpt, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a model folder")
    ap.add_argument("--recipes", default=None, help="comma list (default: every recipe in recipes/)")
    ap.add_argument("--out", type=Path, default=None, help="where checkpoints go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints (Gemma3's are ~0.8 GB each)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--num-samples", type=int, default=None,
                    help="calibration samples per conversion (default: each recipe's own)")
    args = ap.parse_args()

    import torch
    torch.set_num_threads(args.threads)
    recipes = args.recipes.split(",") if args.recipes else sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    base = model_dir(args.model)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="integrity-", dir=ROOT / ".cache"))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for recipe in recipes:
        row = check_one(base, recipe, out_dir, args.keep, args.num_samples)
        rows.append(row)
        if "skipped" in row:
            print(f"{recipe}: skipped ({row['skipped']})", flush=True)
            continue
        margins = ", ".join(f"{m} {w['value']:.4g} at {w['where']} ("
                            + (f"{w['margin']:+.2f} dB to REVIEW)" if m.endswith("_db") else f"{w['margin']:.3g}x REVIEW)")
                            for m, w in row["worst"].items() if m != "tensor_problems")
        print(f"{recipe}: {row['decision']} in {row['pass_s']:.1f} s ({row['pass_cpu_s']:.1f} CPU s; convert "
              f"{row['convert_s']:.0f} s), {row['modules']} modules, {len(row['flagged'])} flagged; {margins}",
              flush=True)
        for text in row["flagged"]:
            print(f"    {text}", flush=True)
        w = row["without_record"]
        print(f"    without the row record: {w['decision']}, {len(w['flagged'])} flagged; worst unit "
              f"{w['worst'].get('recon_unit_excess_db', {}).get('value', float('nan')):.2f} dB at "
              f"{w['worst'].get('recon_unit_excess_db', {}).get('where')}", flush=True)
    done = [r for r in rows if "pass_s" in r]
    summary = {"model": args.model, "baseline": str(base), "threads": args.threads, "checkpoints": len(done),
               "flagged_checkpoints": [r["recipe"] for r in done if r["flagged"]],
               "flagged_without_record": [r["recipe"] for r in done if r["without_record"]["flagged"]],
               "max_pass_s": max((r["pass_s"] for r in done), default=None)}
    if args.model == "smollm2" and done:
        summary["eval_seconds"] = EVAL_SECONDS
        summary["max_pass_share_of_eval"] = summary["max_pass_s"] / EVAL_SECONDS
    doc = {"summary": summary, "runs": rows}
    print(json.dumps(doc, indent=1))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    if not args.keep and args.out is None:
        shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
