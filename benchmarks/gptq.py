"""GPTQ benchmark: quantkit against llm-compressor on the same model, data and grid.

One run measures, each in its own subprocess (so peak memory is that run's alone):
  - the unquantized model (perplexity only),
  - quantkit RTN on the grid (perplexity only: the baseline GPTQ must improve on),
  - quantkit GPTQ, and GPTQ with act-order, if asked (wall time, peak RSS, perplexity),
  - llm-compressor's GPTQModifier (wall time, peak RSS, perplexity) when an interpreter
    with ``llmcompressor`` is found (``--llmc-python``, default ``.venv-llmc/bin/python``).

Everything is offline:
  - held-out text: gensim's ``test/test_data/lee_background.cor`` (Australian news, the
    Lee corpus, from the gensim wheel on PyPI): its first ``--eval-windows`` non-overlapping
    windows of ``--seq-len`` tokens. Perplexity: exp(mean next-token NLL) over them.
  - calibration text (``--calibration lee``, the default): ``--samples`` windows at seeded
    random offsets in the rest of the Lee corpus — same domain, disjoint articles, as
    C4-train/C4-validation setups do. ``--calibration pydoc`` takes them from the standard
    library's ``pydoc_data/topics.py`` instead (Python reference docs): measured here, that
    out-of-domain calibration makes GPTQ worse than RTN on the news text (RESULTS.md).
    Both toolkits get the same token ids.

Models: ``smollm2`` (the embedded SmolLM2-135M, dequantized from its GGUF), ``gemma3``
(Gemma3-270M from its GGUF parts, tokenizer rebuilt from the GGUF's sentencepiece data:
see ``benchmarks/gemma3.py``), or a local HF folder.

Usage:
    python benchmarks/gptq.py --model smollm2 --samples 32 --seq-len 512
    python benchmarks/gptq.py --model gemma3 --no-llmc --actorder none,weight,group
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve()


# -- data -------------------------------------------------------------------------------------
def calibration_text() -> str:
    import pydoc_data.topics as topics

    return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))


def heldout_text() -> str:
    """gensim's Lee background corpus, extracted from the gensim wheel (cached)."""
    cache = ROOT / ".cache" / "benchmarks"
    target = cache / "lee_background.cor"
    if target.exists():
        return target.read_text(encoding="utf-8")
    import glob
    import zipfile

    cache.mkdir(parents=True, exist_ok=True)
    wheels = glob.glob(str(cache / "gensim-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "gensim", "-d", str(cache), "-q"],
                       check=True)
        wheels = glob.glob(str(cache / "gensim-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        target.write_bytes(z.read("gensim/test/test_data/lee_background.cor"))
    return target.read_text(encoding="utf-8")


def token_windows(ids: list[int], n: int, length: int, seed: int | None) -> list[list[int]]:
    """``n`` windows of ``length`` tokens: consecutive (seed None) or at seeded random offsets."""
    if seed is None:
        return [ids[i * length:(i + 1) * length] for i in range(min(n, len(ids) // length))]
    rng = random.Random(seed)
    starts = sorted(rng.sample(range(0, len(ids) - length), n))
    return [ids[s:s + length] for s in starts]


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_adds_bos(tokenizer) -> bool:
    ids = tokenizer("a")["input_ids"]
    return tokenizer.bos_token_id is not None and len(ids) > 0 and ids[0] == tokenizer.bos_token_id


def perplexity(model, windows: list[list[int]], bos: int | None) -> float:
    """exp(mean next-token NLL) over non-overlapping windows (a BOS is prepended when given)."""
    import torch

    nll, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for w in windows:
            ids = ([bos] if bos is not None else []) + list(w)
            x = torch.tensor([ids])
            logits = model(input_ids=x).logits[0, :-1].float()
            target = x[0, 1:]
            nll += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
            count += target.numel()
    return float(torch.exp(torch.tensor(nll / count)))


def heldout_and_calibration(tok, eval_windows: int, seq_len: int, samples: int, seed: int,
                            calibration: str = "lee") -> tuple[list[list[int]], list[list[int]], int | None]:
    """The held-out windows (the Lee corpus' first ``eval_windows`` of ``seq_len`` tokens), the
    calibration windows (``lee``: at seeded offsets in the rest of the corpus; ``pydoc``: in the
    standard library's reference text) and the BOS a model whose tokenizer adds one sees first."""
    bos = tok.bos_token_id if encode_adds_bos(tok) else None
    lee = encode(tok, heldout_text())
    held = token_windows(lee, eval_windows, seq_len, None)
    # lee: the rest of the corpus, after the evaluation windows: same domain, other articles
    pool = lee[eval_windows * seq_len:] if calibration == "lee" else encode(tok, calibration_text())
    calib = token_windows(pool, samples, seq_len - (bos is not None), seed)
    return held, [([bos] if bos is not None else []) + w for w in calib], bos


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- models -----------------------------------------------------------------------------------
def model_dir(name: str) -> Path:
    if name == "smollm2":
        from quantkit.inputs.embedded_model import default_model_dir

        return default_model_dir()
    if name == "gemma3":
        sys.path.insert(0, str(HERE.parent))
        from gemma3 import gemma3_model_dir

        return gemma3_model_dir()
    return Path(name)


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


# -- workers (each in its own process) --------------------------------------------------------
def scheme_dict(group_size: int, actorder: str | None, observer: str = "minmax") -> dict:
    return {"group_0": {"targets": ["Linear"], "weights": {
        "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
        "group_size": group_size, "actorder": actorder, "observer": observer}}}


def worker_quantkit(spec: dict) -> dict:
    import torch

    import quantkit

    torch.set_num_threads(spec["threads"])
    folder = Path(spec["model_dir"])
    calib = spec["calibration"]
    out = {}
    if spec["variant"] == "fp32":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        out["peak_rss_mb_quantize"] = None
    else:
        # RTN is the plain min-max baseline the issue defines; --observer applies to GPTQ runs
        observer = spec.get("observer", "minmax") if spec["algorithm"] == "gptq" else "minmax"
        recipe = {"version": 1, "config_groups": scheme_dict(spec["group_size"], spec.get("actorder"), observer),
                  "ignore": ["lm_head"], "algorithm": {"name": spec["algorithm"], **spec.get("options", {})},
                  "calibration": {"num_samples": len(calib), "max_seq_len": spec["seq_len"],
                                  "offload": bool(spec.get("offload"))}}
        t0, c0 = time.perf_counter(), time.process_time()
        q = quantkit.quantize(folder, recipe, calib if spec["algorithm"] != "rtn" else None,
                              quantkit.ConvertOptions(workdir=spec["workdir"]))
        out["seconds"] = time.perf_counter() - t0
        out["cpu_seconds"] = time.process_time() - c0
        out["peak_rss_mb_quantize"] = peak_rss_mb()
        log = json.loads((q.path / "quantization_log.json").read_text())
        mods = log["modules"].values()
        if spec["algorithm"] == "gptq":
            out["damping_retries"] = sum(m.get("damping_retries", 0) for m in mods)
            ratios = [m["loss_vs_rtn"] for m in mods if m.get("loss_vs_rtn") is not None]
            out["loss_vs_rtn_mean"] = sum(ratios) / max(len(ratios), 1)
        model = q.load()
    out["perplexity"] = perplexity(model, spec["eval"], spec["bos"])
    return out


def worker_llmc(spec: dict) -> dict:
    """llm-compressor's GPTQModifier, run with its own interpreter (it pins other versions)."""
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(spec["threads"])
    calib = spec["calibration"]
    t0, c0 = time.perf_counter(), time.process_time()
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
    ds = Dataset.from_dict({"input_ids": calib, "attention_mask": [[1] * len(c) for c in calib]})
    # "" asks for no act-order explicitly; absent leaves llm-compressor's default
    options = {"actorder": spec["actorder"] or None} if "actorder" in spec else {}
    modifier = GPTQModifier(config_groups=scheme_dict(spec["group_size"], None, spec.get("observer", "minmax")),
                            ignore=["lm_head"],
                            block_size=128, dampening_frac=0.01, **options)
    oneshot(model=model, dataset=ds, recipe=modifier, max_seq_length=spec["seq_len"],
            num_calibration_samples=len(calib), shuffle_calibration_samples=False)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    rss = peak_rss_mb()
    actorder = str(model.model.layers[0].self_attn.q_proj.quantization_scheme.weights.actorder)
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_mb_quantize": rss, "actorder": actorder,
            "perplexity": perplexity(model, spec["eval"], spec["bos"])}


def run_worker(python: str, kind: str, spec: dict, timeout: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.json"
        result_path = Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
        t0 = time.perf_counter()
        proc = subprocess.run([python, str(HERE), "--worker", kind, str(spec_path), str(result_path)],
                              env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout)[-3000:]
            return {"error": f"exit {proc.returncode}: {tail}"}
        out = json.loads(result_path.read_text())
        out["process_seconds"] = time.perf_counter() - t0
        return out


# -- main --------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3, or a local HF folder")
    ap.add_argument("--samples", type=int, default=128, help="calibration samples (both toolkits)")
    ap.add_argument("--seq-len", type=int, default=512, help="tokens per calibration sample and eval window")
    ap.add_argument("--eval-windows", type=int, default=40, help="held-out windows of --seq-len tokens")
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calibration", choices=["lee", "pydoc"], default="lee",
                    help="lee: Lee-corpus text after the evaluation windows (default); pydoc: Python docs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--actorder", default="weight",
                    help="comma list of act-order settings for quantkit's runs: none, weight, group "
                         "(llm-compressor runs the first)")
    ap.add_argument("--observer", choices=["minmax", "mse"], default="minmax",
                    help="weight range observer of every GPTQ run, both toolkits (RTN stays min-max)")
    ap.add_argument("--true-sequential", choices=["default", "on", "off", "both"], default="default")
    ap.add_argument("--offload", choices=["off", "on", "both"], default="off",
                    help="quantkit GPTQ with calibration.offload (hidden states and paused batches in files)")
    ap.add_argument("--no-llmc", action="store_true", help="skip llm-compressor")
    ap.add_argument("--llmc-python", default=str(ROOT / ".venv-llmc" / "bin" / "python"))
    ap.add_argument("--timeout", type=int, default=7200, help="seconds per subprocess")
    ap.add_argument("--json", help="write all figures to this file")
    ap.add_argument("--only", help="comma-separated run labels to do (e.g. fp32,quantkit-rtn,llmc-gptq)")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.worker:
        kind, spec_path, result_path = a.worker
        spec = json.loads(Path(spec_path).read_text())
        out = worker_quantkit(spec) if kind == "quantkit" else worker_llmc(spec)
        Path(result_path).write_text(json.dumps(out))
        return

    folder = model_dir(a.model)
    tok = load_tokenizer(folder)
    held, calib, bos = heldout_and_calibration(tok, a.eval_windows, a.seq_len, a.samples, a.seed, a.calibration)
    workdir = ROOT / ".cache" / "benchmarks" / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    base = {"model_dir": str(folder), "calibration": calib, "eval": held, "bos": bos, "seq_len": a.seq_len,
            "group_size": a.group_size, "threads": a.threads, "workdir": str(workdir), "observer": a.observer}

    runs: dict[str, dict] = {}

    only = set(a.only.split(",")) if a.only else None

    def run(label: str, kind: str, python: str = sys.executable, **extra) -> None:
        if only is not None and label not in only:
            return
        print(f"[{time.strftime('%H:%M:%S')}] {label} ...", file=sys.stderr, flush=True)
        runs[label] = run_worker(python, kind, {**base, **extra}, a.timeout)
        print(f"[{time.strftime('%H:%M:%S')}] {label}: {json.dumps(runs[label])[:400]}", file=sys.stderr, flush=True)

    run("fp32", "quantkit", variant="fp32")
    run("quantkit-rtn", "quantkit", variant="q", algorithm="rtn")
    ts = {"default": [None], "on": [True], "off": [False], "both": [True, False]}[a.true_sequential]
    orders = [None if o == "none" else o for o in a.actorder.split(",")]
    for o in orders:
        if o not in (None, "weight", "group"):
            ap.error(f"--actorder: unknown setting {o!r} (none, weight, group)")
    for t in ts:
        opts = {} if t is None else {"true_sequential": t}
        suffix = "" if t is None else ("-trueseq" if t else "-oneshot")
        for order in orders:
            for offload in {"off": [False], "on": [True], "both": [False, True]}[a.offload]:
                run(f"quantkit-gptq{suffix}{'-offload' if offload else ''}-actorder-{order or 'none'}", "quantkit",
                    variant="q", algorithm="gptq", options=opts, actorder=order, offload=offload)
    llmc = Path(a.llmc_python)
    if not a.no_llmc and llmc.exists():
        run(f"llmc-gptq-actorder-{orders[0] or 'none'}", "llmc", python=str(llmc), actorder=orders[0] or "")
    elif not a.no_llmc:
        print(f"llm-compressor interpreter not found at {llmc}: skipped", file=sys.stderr)

    report(a, runs, len(calib), sum(map(len, held)))
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "runs": runs}, indent=2))


def report(a, runs: dict[str, dict], n_calib: int, eval_tokens: int) -> None:
    source = "Lee corpus, after the held-out part" if a.calibration == "lee" else "pydoc topics"
    print(f"\nmodel {a.model}; W4A16 symmetric g{a.group_size}; calibration {n_calib} x {a.seq_len} tokens "
          f"({source}); held-out {eval_tokens} tokens (Lee corpus, first windows); {a.threads} threads")
    print(f"{'run':34s} {'wall s':>9s} {'CPU s':>9s} {'peak RSS MB':>12s} {'perplexity':>11s}")
    for label, r in runs.items():
        if "error" in r:
            print(f"{label:34s} ERROR {r['error'][-300:]}")
            continue
        s = f"{r['seconds']:9.1f} {r['cpu_seconds']:9.1f}" if r.get("seconds") is not None else f"{'-':>9s} {'-':>9s}"
        m = f"{r['peak_rss_mb_quantize']:12.0f}" if r.get("peak_rss_mb_quantize") else f"{'-':>12s}"
        print(f"{label:34s} {s} {m} {r['perplexity']:11.3f}")
    fp, rtn = runs.get("fp32", {}).get("perplexity"), runs.get("quantkit-rtn", {}).get("perplexity")
    if fp and rtn:
        for label, r in runs.items():
            if "gptq" in label and "perplexity" in r:
                removed = (rtn - r["perplexity"]) / (rtn - fp) if rtn != fp else float("nan")
                print(f"{label}: removes {100 * removed:.1f}% of RTN's perplexity increase "
                      f"({fp:.3f} -> RTN {rtn:.3f} -> {r['perplexity']:.3f})")
    ours = [k for k in runs if k.startswith("quantkit-gptq") and "perplexity" in runs[k]]
    theirs = next((r for k, r in runs.items() if k.startswith("llmc-gptq")), None)
    if theirs and "perplexity" in theirs:
        for k in ours:
            r = runs[k]
            print(f"{k} / llm-compressor: wall time x{r['seconds'] / theirs['seconds']:.3f}, "
                  f"CPU time x{r['cpu_seconds'] / theirs['cpu_seconds']:.3f}, "
                  f"peak RSS x{r['peak_rss_mb_quantize'] / theirs['peak_rss_mb_quantize']:.3f}, "
                  f"perplexity x{r['perplexity'] / theirs['perplexity']:.4f}")


if __name__ == "__main__":
    main()
