"""The engine contract: what quantkit needs of a serving engine it starts itself.

An engine kind (one module per engine, registered in engines.py; vLLM's is vllm.py) finds its
installation and reads the host's capabilities from it (``find``), starts a server for a model
folder under ``ServeOptions`` (``start``: started at once, healthy at ``ready()``, stopped with
every process it made at ``stop()``, its own last error line at ``last_error()``), and turns the
memory account into its launch config (``launch_config``, ``command_line``). Once healthy, a
server is an OpenAI-compatible endpoint (client.py): scoring, generation, capacity metrics and the
load generator all speak to it over HTTP, so a user's own server (``--endpoint``) takes the same
path with nothing started.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Protocol

from quantkit.serving.capabilities import Capabilities, DtypeChoice
from quantkit.serving.client import EngineError, Endpoint
from quantkit.serving.memory_account import Footprint
from quantkit.serving.probe import TooSlow


@dataclass(frozen=True)
class Engine:
    """An installation of an engine kind: the Python it runs from, its versions, the host it sees."""
    kind: str
    python: Path
    version: str
    torch: str
    capabilities: Capabilities = field(default_factory=Capabilities)

    @property
    def cuda(self) -> bool:
        return self.capabilities.cuda


@dataclass(frozen=True)
class ServeOptions:
    """How one server is started."""
    max_model_len: int
    dtype: str = "auto"                 # auto: capabilities.serving_dtype for the checkpoint
    dtype_reason: str | None = None     # why ``dtype`` (recorded with the server's settings)
    max_logprobs: int = 20
    kv_cache_dtype: str | None = None   # None: fp8 when the checkpoint has a kv_cache_scheme
    startup_timeout_s: float = 900.0
    cpu_kv_cache_gib: int = 2
    extra_args: tuple[str, ...] = ()


@dataclass
class Served:
    """A running, healthy server: its endpoint, what it was started with and what it says it runs."""
    endpoint: Endpoint
    command: list[str]
    log: Path
    pid: int
    settings: dict = field(default_factory=dict)


class Server(Protocol):
    """One server of an engine, started on creation."""
    log: Path
    command: list[str]

    def ready(self) -> Served:
        """Wait until it is healthy; one ``EngineError`` line (its own last error) if it never is."""

    def stop(self, clean: bool = False) -> None:
        """Stop every process it made; ``clean``: it ran without error and its log may go."""

    def last_error(self) -> str:
        """The last error line of its log, for a message that names the cause."""


class EngineKind(Protocol):
    """One serving engine quantkit can start (vllm.py)."""
    name: str

    def find(self, python: str | Path | None = None, flag: str = "--engine-python") -> Engine:
        """The installation (``python``, else the kind's default), its capabilities read."""

    def dtype(self, engine: Engine, model_dir: Path, asked: str = "auto") -> DtypeChoice:
        """The dtype ``model_dir`` is served in on this engine's host, and why."""

    def start(self, engine: Engine, model_dir: Path, opts: ServeOptions, log_dir: Path | None = None) -> Server:
        """A server for ``model_dir`` on 127.0.0.1, starting."""

    def launch_config(self, fp: Footprint, model: str) -> dict:
        """The launch settings the memory account ``fp`` gives for ``model``."""

    def command_line(self, cfg: dict) -> str:
        """The launch settings as the engine's own command line."""


def failure_note(server: Server) -> str:
    """What a message about a failed request adds: the engine's own last error line and its log."""
    return f"; the engine's last error: {server.last_error()} (log: {server.log})"


@contextmanager
def serve(kind: EngineKind, engine: Engine, model_dir: Path, opts: ServeOptions,
          log_dir: Path | None = None) -> Iterator[Served]:
    """A healthy server until the block is left; then no process of it remains. A request that
    fails inside the block is re-raised with the engine's own last error line and its log."""
    server = kind.start(engine, model_dir, opts, log_dir)
    try:
        yield server.ready()
    except EngineError as e:
        server.stop()
        if isinstance(e, TooSlow) or "the engine's last error" in str(e):
            raise
        raise EngineError(f"{e}{failure_note(server)}") from None
    except BaseException:
        server.stop()
        raise
    server.stop(clean=True)
