"""Layer transforms benchmark: AWQ (W4A16) and SmoothQuant (W8A8) against their baselines.

Same model, calibration and held-out text as ``benchmarks/gptq.py`` (its data functions are
reused): calibration windows from the Lee corpus after the held-out part, perplexity over
the first ``--eval-windows`` windows. Each run is its own subprocess (peak RSS is that run's).

``--suite w4`` (W4A16 symmetric, group ``--group-size``): fp32, RTN, AWQ without the clip
search, AWQ (the options of ``recipes/awq-w4a16-g64.yaml``), AWQ+GPTQ, GPTQ (the options of
``recipes/w4a16-g64-gptq.yaml``), and llm-compressor's AWQModifier when its interpreter exists
(``--llmc-python``; ``benchmarks/llmc_awq.py`` runs it on the CPU).
``--suite w4-parts``: RTN W4A16 with one module kind (q/k/v, o_proj, gate/up, down_proj) kept
in float at a time, to see where RTN's damage comes from.
``--suite w8a8`` (int8 weights per channel, int8 dynamic per-token activations): fp32, RTN,
GPTQ, SmoothQuant+RTN, SmoothQuant+GPTQ. Perplexity of W8A8 runs goes through quantkit's
packed int8 path (``quantkit.load``), not fake quantization.

Usage:
    python benchmarks/awq.py --model smollm2 --suite w4 --json out.json
    python benchmarks/awq.py --model gemma3 --suite w8a8 --no-llmc
    python benchmarks/awq.py --suite w4 --threads 1 --no-llmc --only awq,gptq --jobs 2
    python benchmarks/awq.py --suite w4 --threads 1 --no-llmc --only awq,gptq --jobs 2 --layers 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import gptq as bench  # noqa: E402  (data, perplexity and subprocess helpers shared with the GPTQ benchmark)

GPTQ_OPTIONS = {"block_size": 128, "dampening_frac": 0.01}
#: The AWQ step's options in the "awq" run: the shipped recipe's (``--awq-options`` adds to them).
SHIPPED_AWQ = HERE.parents[1] / "recipes" / "awq-w4a16-g64.yaml"


def shipped_awq_options() -> dict:
    import yaml

    steps = yaml.safe_load(SHIPPED_AWQ.read_text())["steps"]
    return dict(next(s["awq"] for s in steps if isinstance(s, dict) and "awq" in s))


def w4_groups(group_size: int, observer: str, actorder: str | None = None) -> dict:
    return bench.scheme_dict(group_size, actorder, observer)


W8A8_GROUPS = {"group_0": {"targets": ["Linear"],
                           "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
                           "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                                 "strategy": "token", "dynamic": True}}}


def suite_runs(suite: str, group_size: int, awq_options: dict) -> dict[str, dict]:
    """label -> recipe (without calibration); None for the unquantized model."""
    if suite == "w4":
        rtn = w4_groups(group_size, "minmax")
        mse = w4_groups(group_size, "mse", "weight")
        return {
            "fp32": None,
            "rtn": {"config_groups": rtn, "steps": ["rtn"]},
            "awq-noclip": {"config_groups": rtn, "steps": [{"awq": {**awq_options, "clip": False}}, "rtn"]},
            "awq": {"config_groups": rtn, "steps": [{"awq": awq_options}, "rtn"]},
            "awq+gptq": {"config_groups": mse, "steps": [{"awq": awq_options}, {"gptq": GPTQ_OPTIONS}]},
            "gptq": {"config_groups": mse, "steps": [{"gptq": GPTQ_OPTIONS}]},
        }
    if suite == "w4-parts":
        # where RTN's damage comes from: one module kind kept in float, the rest RTN
        rtn = w4_groups(group_size, "minmax")
        kinds = {"all": [], "keep-o": ["re:.*o_proj"], "keep-down": ["re:.*down_proj"],
                 "keep-qkv": ["re:.*[qkv]_proj"], "keep-gateup": ["re:.*(gate|up)_proj"]}
        return {f"rtn-{k}": {"config_groups": rtn, "steps": ["rtn"], "ignore": ["lm_head", *extra]}
                for k, extra in kinds.items()}
    if suite == "w8a8":
        sq = {"smoothquant": {"alphas": [0.3, 0.4, 0.5, 0.6, 0.7, 0.8]}}
        return {
            "fp32": None,
            "w8a8-rtn": {"config_groups": W8A8_GROUPS, "steps": ["rtn"]},
            "w8a8-gptq": {"config_groups": W8A8_GROUPS, "steps": [{"gptq": GPTQ_OPTIONS}]},
            "w8a8-sq": {"config_groups": W8A8_GROUPS, "steps": [sq, "rtn"]},
            "w8a8-sq+gptq": {"config_groups": W8A8_GROUPS, "steps": [sq, {"gptq": GPTQ_OPTIONS}]},
        }
    raise SystemExit(f"--suite: unknown suite {suite!r} (w4, w4-parts, w8a8)")


def first_layers(folder: Path, layers: int) -> Path:
    """A copy of the model with its first ``layers`` decoder layers only (cached): the per-layer
    cost of each method without a whole-model run. Its perplexity measures nothing."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = bench.ROOT / ".cache" / "benchmarks" / f"{folder.name}-first{layers}"
    if (target / "config.json").exists():
        return target
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(folder).save_pretrained(target)
    return target


def worker(spec: dict) -> dict:
    import torch

    import quantkit

    torch.set_num_threads(spec["threads"])
    folder = Path(spec["model_dir"])
    out: dict = {}
    if spec["recipe"] is None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    else:
        calib = spec["calibration"]
        recipe = {"version": 1, "ignore": ["lm_head"], **spec["recipe"],
                  "calibration": {"num_samples": len(calib), "max_seq_len": spec["seq_len"]}}
        t0, c0 = time.perf_counter(), time.process_time()
        q = quantkit.quantize(folder, recipe, calib, quantkit.ConvertOptions(workdir=spec["workdir"]))
        out["seconds"] = time.perf_counter() - t0
        out["cpu_seconds"] = time.process_time() - c0
        out["peak_rss_mb_quantize"] = bench.peak_rss_mb()
        log = json.loads((q.path / "quantization_log.json").read_text())
        out["transforms"] = _transform_summary(log.get("transforms", {}))
        model = q.load()
    out["perplexity"] = bench.perplexity(model, spec["eval"], spec["bos"])
    return out


def _transform_summary(transforms: dict) -> dict:
    """Mean chosen ratio / alpha and the loss reduction over layers, per step."""
    acc: dict[str, list] = {}
    for layer in transforms.values():
        for step, found in layer.items():
            for mapping, info in found.items():
                if isinstance(info, dict) and ("ratio" in info or "alpha" in info):
                    acc.setdefault(step, []).append(info)
    out = {}
    for step, infos in acc.items():
        key = "ratio" if "ratio" in infos[0] else "alpha"
        before = "loss_rtn" if key == "ratio" else "loss_unsmoothed"
        after = "loss_awq" if key == "ratio" else "loss"
        chosen = [i[key] for i in infos if i[key] is not None]     # None: no scaling won (AWQ)
        out[step] = {f"mean_{key}": sum(chosen) / max(len(chosen), 1), "unscaled": len(infos) - len(chosen)}
        if before in infos[0]:
            out[step]["loss_ratio_mean"] = sum(i[after] / max(i[before], 1e-30) for i in infos) / len(infos)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3, or a local HF folder")
    ap.add_argument("--suite", default="w4", help="w4 (AWQ), w4-parts (RTN by module kind) or w8a8 (SmoothQuant)")
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=40)
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--search-tokens", type=int, default=None, help="AWQ's search_tokens option")
    ap.add_argument("--awq-options", default="{}", help="more AWQ step options, as JSON (e.g. '{\"clip_grid\": 100}')")
    ap.add_argument("--no-llmc", action="store_true")
    ap.add_argument("--llmc-python", default=str(bench.ROOT / ".venv-llmc" / "bin" / "python"))
    ap.add_argument("--timeout", type=int, default=7200)
    ap.add_argument("--only", help="comma-separated run labels")
    ap.add_argument("--layers", type=int, help="the model's first LAYERS decoder layers only (cost per layer)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at a time (each its own subprocess)")
    ap.add_argument("--json", help="write all figures to this file")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        _, spec_path, result_path = a.worker
        Path(result_path).write_text(json.dumps(worker(json.loads(Path(spec_path).read_text()))))
        return

    folder = bench.model_dir(a.model)
    if a.layers:
        folder = first_layers(folder, a.layers)
    tok = bench.load_tokenizer(folder)
    bos = tok.bos_token_id if bench.encode_adds_bos(tok) else None
    lee = bench.encode(tok, bench.heldout_text())
    held = bench.token_windows(lee, a.eval_windows, a.seq_len, None)
    pool = lee[a.eval_windows * a.seq_len:]
    calib = bench.token_windows(pool, a.samples, a.seq_len - (bos is not None), a.seed)
    calib = [([bos] if bos is not None else []) + w for w in calib]
    workdir = bench.ROOT / ".cache" / "benchmarks" / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    base = {"model_dir": str(folder), "calibration": calib, "eval": held, "bos": bos, "seq_len": a.seq_len,
            "group_size": a.group_size, "threads": a.threads, "workdir": str(workdir)}
    awq_options = shipped_awq_options()
    if a.search_tokens is not None:
        awq_options["search_tokens"] = a.search_tokens
    awq_options.update(json.loads(a.awq_options))
    only = set(a.only.split(",")) if a.only else None
    runs: dict[str, dict] = {}

    jobs: list[tuple[str, str, Path, dict]] = []
    for label, recipe in suite_runs(a.suite, a.group_size, awq_options).items():
        jobs.append((label, sys.executable, HERE, {**base, "recipe": recipe}))
    llmc = Path(a.llmc_python)
    if a.suite == "w4" and not a.no_llmc:
        if llmc.exists():
            jobs.append(("llmc-awq", str(llmc), HERE.parent / "llmc_awq.py", base))
        else:
            print(f"llm-compressor interpreter not found at {llmc}: skipped", file=sys.stderr)
    jobs = [j for j in jobs if only is None or j[0] in only]

    def run(job: tuple[str, str, Path, dict]) -> dict:
        label = job[0]
        print(f"[{time.strftime('%H:%M:%S')}] {label} ...", file=sys.stderr, flush=True)
        result = _run(*job[1:], a.timeout)
        print(f"[{time.strftime('%H:%M:%S')}] {label}: {json.dumps(result)[:300]}", file=sys.stderr, flush=True)
        return result

    # --jobs 2: the runs side by side, each on its own thread count, under the same load
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        runs.update(zip([j[0] for j in jobs], pool.map(run, jobs)))
    report(a, runs, len(calib), sum(map(len, held)))
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "runs": runs}, indent=2))


def _run(python: str, script: Path, spec: dict, timeout: int) -> dict:
    """``bench.run_worker`` for another script: the same spec/result protocol."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, PYTHONPATH=str(bench.ROOT), TOKENIZERS_PARALLELISM="false")
        proc = subprocess.run([python, str(script), "--worker", "run", str(spec_path), str(result_path)],
                              env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-3000:]}"}
        return json.loads(result_path.read_text())


def report(a, runs: dict[str, dict], n_calib: int, eval_tokens: int) -> None:
    layers = f" (its first {a.layers} layers)" if a.layers else ""
    print(f"\nmodel {a.model}{layers}; suite {a.suite} (g{a.group_size} for w4); calibration {n_calib} x {a.seq_len} "
          f"tokens (Lee corpus); held-out {eval_tokens} tokens; {a.threads} threads")
    print(f"{'run':16s} {'wall s':>8s} {'CPU s':>8s} {'peak RSS MB':>12s} {'perplexity':>11s} {'vs fp32':>8s}  transforms")
    fp = runs.get("fp32", {}).get("perplexity")
    base = runs.get({"w4": "rtn", "w4-parts": "rtn-all"}.get(a.suite, "w8a8-rtn"), {}).get("perplexity")
    for label, r in runs.items():
        if "error" in r:
            print(f"{label:16s} ERROR {r['error'][-400:]}")
            continue
        t = f"{r['seconds']:8.1f} {r['cpu_seconds']:8.1f}" if r.get("seconds") else f"{'-':>8s} {'-':>8s}"
        m = f"{r['peak_rss_mb_quantize']:12.0f}" if r.get("peak_rss_mb_quantize") else f"{'-':>12s}"
        rel = f"{100 * (r['perplexity'] / fp - 1):+7.2f}%" if fp else ""
        print(f"{label:16s} {t} {m} {r['perplexity']:11.3f} {rel:>8s}  {json.dumps(r.get('transforms', {}))}")
    if fp and base and base != fp:
        for label, r in runs.items():
            if label not in ("fp32", "rtn", "w8a8-rtn") and "perplexity" in r:
                print(f"{label}: removes {100 * (base - r['perplexity']) / (base - fp):.1f}% of RTN's increase")
    awq, gptq = runs.get("awq", {}), runs.get("gptq", {})
    if awq.get("cpu_seconds") and gptq.get("cpu_seconds"):   # the goal: AWQ within 2.5x GPTQ's CPU time
        print(f"awq / gptq: CPU x{awq['cpu_seconds'] / gptq['cpu_seconds']:.2f}, "
              f"perplexity {awq['perplexity']:.3f} vs {gptq['perplexity']:.3f}")
    ref = runs.get("llmc-awq")
    if ref and "perplexity" in ref and "awq" in runs and "seconds" in runs["awq"]:
        r = runs["awq"]
        print(f"awq / llm-compressor AWQ: wall x{r['seconds'] / ref['seconds']:.3f}, "
              f"perplexity {r['perplexity']:.3f} vs {ref['perplexity']:.3f}")


if __name__ == "__main__":
    main()
