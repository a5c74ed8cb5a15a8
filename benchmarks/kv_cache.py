"""KV-cache benchmark: the perplexity step from FP8_DYNAMIC weights to FP8_DYNAMIC + FP8 KV cache.

On the held-out text of ``benchmarks/gptq.py`` (gensim's Lee corpus: its first ``--eval-windows``
windows of ``--seq-len`` tokens; calibration: ``--samples`` windows at seeded offsets in the rest
of the corpus, the same token ids for every run), this script measures, in this interpreter:

  - ``fp8-dynamic``: ``quantkit.quantize`` with the FP8_DYNAMIC scheme (lm_head kept), loaded
    with ``quantkit.load``: the weight-only step the KV runs are compared with;
  - ``kv-<strategy>-<observer>``: the same plus the recipe key ``kv_cache: {strategy, observer}``
    (``tensor`` / ``attn_head``, ``minmax`` / ``mse``), loaded with ``quantkit.load``, which
    selects the attention that reads K and V as the FP8 cache holds them;
  - ``--calibration default`` calibrates on quantkit's default set instead (what ``quantkit
    convert`` uses without ``--calib``: business-traffic-like rows, other text than the news);
  - with ``--kv-options``: evaluated KV options (``quantkit.kv_cache.kv_option``) applied to the
    ``fp8-dynamic`` checkpoint with ``apply_kv_option``, static ones calibrated on the same
    calibration windows;
  - with ``--scale-sweep 1,1.05,1.1``: a KV checkpoint's static scales times each factor; a
    factor above 1 clips nothing more and only moves the E4M3 grid, so the spread of those
    perplexities is the rounding noise any KV comparison on this text carries;
  - with an llm-compressor interpreter (``--llmc-python``, default ``.venv-llmc/bin/python``):
    llm-compressor's ``QuantizationModifier(scheme="FP8_DYNAMIC", kv_cache_scheme=...)`` run on
    the same calibration ids in its own process, its checkpoint saved and then scored here through
    ``quantkit.load`` (the same attention reads its ``k_scale`` / ``v_scale``), so the step is
    compared like for like.

Every checkpoint is kept under ``--keep`` (default ``.cache/benchmarks/kv``) for
``benchmarks/vllm_check.py --checkpoint ... --kv-cache-dtype fp8``.

Usage:
    OMP_NUM_THREADS=1 nice -n 5 .venv/bin/python benchmarks/kv_cache.py --json kv.json
    .venv/bin/python benchmarks/kv_cache.py --only fp8-dynamic --kv-options fp8-token-head,int8-kivi:k
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent))

from gptq import heldout_and_calibration, load_tokenizer, model_dir, perplexity  # noqa: E402

STRATEGIES = {"tensor": "tensor", "head": "attn_head"}
KV_RUNS = [f"kv-{s}-{o}" for s in STRATEGIES for o in ("minmax", "mse")]


def recipe(kv: dict | None, samples: int, seq_len: int) -> dict:
    r = {"version": 1, "scheme": "FP8_DYNAMIC", "ignore": ["lm_head"], "algorithm": {"name": "rtn"},
         "calibration": {"num_samples": samples, "max_seq_len": seq_len}}
    return {**r, "kv_cache": kv} if kv is not None else r


def quantkit_checkpoint(folder: Path, label: str, kv: dict | None, calib: list[list[int]], seq_len: int,
                        keep: Path) -> tuple[Path, float]:
    import quantkit

    t0 = time.perf_counter()
    q = quantkit.quantize(folder, recipe(kv, len(calib), seq_len), calibration=calib if kv else None)
    out = keep / label
    if out.exists():
        shutil.rmtree(out)
    q.save(out)
    return out, time.perf_counter() - t0


def worker_llmc(spec: dict) -> dict:
    """llm-compressor's FP8_DYNAMIC (+ kv_cache_scheme) in its own interpreter; saves compressed."""
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    calib = spec["calibration"]
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    kv = spec.get("kv")
    modifier = QuantizationModifier(scheme="FP8_DYNAMIC", ignore=["lm_head"],
                                    **({"kv_cache_scheme": {"num_bits": 8, "type": "float", "symmetric": True,
                                                            "dynamic": False, "strategy": kv["strategy"],
                                                            "observer": kv["observer"]}} if kv else {}))
    ds = Dataset.from_dict({"input_ids": calib, "attention_mask": [[1] * len(c) for c in calib]})
    oneshot(model=model, dataset=ds, recipe=modifier, max_seq_length=spec["seq_len"],
            num_calibration_samples=len(calib), shuffle_calibration_samples=False)
    model.save_pretrained(spec["out"], save_compressed=True)
    return {"seconds": time.perf_counter() - t0}


def run_llmc(python: str, spec: dict, timeout: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        sp, rp = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        sp.write_text(json.dumps(spec))
        p = subprocess.run([python, str(HERE), "--worker", str(sp), str(rp)], timeout=timeout,
                           capture_output=True, text=True)
        if p.returncode != 0:
            return {"error": (p.stderr or p.stdout)[-2000:]}
        return json.loads(rp.read_text())


def score(ckpt: Path, held: list[list[int]], bos: int | None, view=None) -> dict:
    import quantkit

    model = quantkit.load(ckpt)
    info = dict(model.quantkit_info)
    if view is None:
        return {"perplexity": perplexity(model, held, bos), "attention": info["attention"],
                "kv_cache": info["kv_cache"]}
    from quantkit.kv_cache import apply_kv_option, kv_option, prepare_kv

    prepared = prepare_kv(model, kv_option(view["option"]), calibration=view.get("calibration"))
    c = view.get("factor", 1.0)   # static scales times c: c > 1 clips nothing more, only moves the grid
    prepared.scales = {i: (k * c, v * c) for i, (k, v) in prepared.scales.items()}
    with apply_kv_option(model, prepared) as m:
        ppl = perplexity(m, held, bos)
    return {"perplexity": ppl, "scales": prepared.source + (f", times {c:g}" if c != 1.0 else "")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3, or a local HF folder")
    ap.add_argument("--samples", type=int, default=128, help="calibration windows")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per calibration and eval window")
    ap.add_argument("--eval-windows", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calibration", choices=["lee", "default"], default="lee",
                    help="lee: windows of the rest of the Lee corpus (gptq.py's); default: quantkit's default "
                         "calibration set (calibration/default.jsonl, --samples rows up to --seq-len tokens)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", help="comma list of runs (fp8-dynamic, kv-tensor-mse, llmc-kv-head-minmax, ...)")
    ap.add_argument("--kv-options", default="", help="evaluated KV options on the fp8-dynamic checkpoint")
    ap.add_argument("--eval-len", type=int, default=None, help="held-out window length (default --seq-len)")
    ap.add_argument("--rescore", default="", help="score these runs already under --keep (no converting)")
    ap.add_argument("--scale-sweep", default="",
                    help="factors (e.g. 1,1.05,1.1,1.25) for the static scales of --sweep-checkpoint: the spread of "
                         "the perplexity over factors >= 1 (no more clipping) is the rounding noise of a KV comparison")
    ap.add_argument("--sweep-checkpoint", default="kv-tensor-minmax", help="a run label under --keep")
    ap.add_argument("--keep", default=str(ROOT / ".cache" / "benchmarks" / "kv"), help="checkpoint folder")
    ap.add_argument("--llmc-python", default=str(ROOT / ".venv-llmc" / "bin" / "python"))
    ap.add_argument("--no-llmc", action="store_true")
    ap.add_argument("--timeout", type=int, default=7200)
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        spec = json.loads(Path(a.worker[0]).read_text())
        Path(a.worker[1]).write_text(json.dumps(worker_llmc(spec)))
        return

    import torch
    torch.set_num_threads(a.threads)
    folder = model_dir(a.model)
    tok = load_tokenizer(folder)
    held, calib, bos = heldout_and_calibration(tok, a.eval_windows, a.seq_len, a.samples, a.seed)
    if a.eval_len:   # longer held-out windows from the start of the corpus (calibration unchanged)
        held = heldout_and_calibration(tok, a.eval_windows, a.eval_len, 1, a.seed)[0]
    if a.calibration == "default":   # what `quantkit convert` calibrates on without --calib
        from quantkit.calibration import load_calibration
        calib = load_calibration(None, tok, a.samples, a.seq_len, a.seed)
    keep = Path(a.keep)
    keep.mkdir(parents=True, exist_ok=True)
    only = set(a.only.split(",")) if a.only else None
    runs: dict[str, dict] = {}

    def wanted(label: str) -> bool:
        return only is None or label in only

    def log(label: str, r: dict) -> None:
        runs[label] = r
        print(f"[{time.strftime('%H:%M:%S')}] {label}: {json.dumps(r)}", file=sys.stderr, flush=True)

    labels = ["fp8-dynamic"] + KV_RUNS
    for label in filter(None, a.rescore.split(",")):
        log(f"{label} (rescored)", score(keep / label, held, bos))
    for label in labels:
        if not wanted(label) and not (label == "fp8-dynamic" and a.kv_options) or a.rescore:
            continue
        kv = None
        if label != "fp8-dynamic":
            _, s, o = label.split("-")
            kv = {"num_bits": 8, "type": "float", "strategy": STRATEGIES[s], "symmetric": True, "observer": o}
        ckpt, seconds = quantkit_checkpoint(folder, label, kv, calib, a.seq_len, keep)
        log(label, {**score(ckpt, held, bos), "convert_seconds": seconds, "checkpoint": str(ckpt)})
    for name in filter(None, a.kv_options.split(",")):
        log(f"fp8-dynamic+{name}", score(keep / "fp8-dynamic", held, bos, {"option": name, "calibration": calib}))
    for c in filter(None, a.scale_sweep.split(",")):
        ckpt = keep / a.sweep_checkpoint
        option = "fp8-head" if json.loads((ckpt / "config.json").read_text())["quantization_config"][
            "kv_cache_scheme"]["strategy"] == "attn_head" else "fp8-tensor"
        log(f"{a.sweep_checkpoint} x{c}", score(ckpt, held, bos, {"option": option, "factor": float(c)}))
    llmc = Path(a.llmc_python)
    if not a.no_llmc and llmc.exists():
        for label in ["llmc-fp8-dynamic"] + [f"llmc-{k}" for k in KV_RUNS]:
            if not wanted(label):
                continue
            kv = None
            if label != "llmc-fp8-dynamic":
                _, _, s, o = label.split("-")
                kv = {"strategy": STRATEGIES[s], "observer": o}
            out = keep / label
            if out.exists():
                shutil.rmtree(out)
            r = run_llmc(str(llmc), {"model_dir": str(folder), "calibration": calib, "seq_len": a.seq_len,
                                     "threads": a.threads, "kv": kv, "out": str(out)}, a.timeout)
            if "error" not in r:
                r.update(score(out, held, bos))
            log(label, {**r, "checkpoint": str(out)})
    base = runs.get("fp8-dynamic", {}).get("perplexity")
    lbase = runs.get("llmc-fp8-dynamic", {}).get("perplexity")
    print(f"\n{'run':34s} {'perplexity':>10s} {'step':>8s}")
    for label, r in runs.items():
        ref = lbase if label.startswith("llmc-") else base
        p = r.get("perplexity")
        step = f"{100 * (p / ref - 1):+.2f}%" if p and ref and "fp8-dynamic" != label.split("llmc-")[-1] else ""
        print(f"{label:34s} {p if p is None else round(p, 4)!s:>10s} {step:>8s}")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "eval_tokens": sum(map(len, held)),
                                            "calibration_tokens": sum(map(len, calib)), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
