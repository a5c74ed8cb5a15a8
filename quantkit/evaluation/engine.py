"""``quantkit eval --engine vllm`` / ``--endpoint``: the verdict taken where the model is served.

Two ways in: quantkit starts vLLM's OpenAI server itself (``EngineOptions.engine = "vllm"``), on
127.0.0.1 and a free port, for the baseline and then the candidate (serving/vllm.py: healthy or
its own error line, stopped with every process it made); or the user names two running
OpenAI-compatible servers (``endpoint`` for the candidate, ``baseline_endpoint``). Either way
the models are scored by backends/served.py and the candidate is also loaded in this process
for the path agreement (measures/path.py), unless ``path_tokens`` is 0.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from quantkit.errors import QuantkitError
from quantkit.inputs.model_folder import read_config_json
from quantkit.evaluation.backends.served import ServedModel
from quantkit.evaluation.backends.served_forced import PathCheck
from quantkit.evaluation.checkpoint import load_model
from quantkit.evaluation.models import pad_id
from quantkit.evaluation.engine_options import NOT_MEASURED, EngineOptions
from quantkit.serving.client import Endpoint
from quantkit.serving.vllm import Engine, ServeOptions, Server, engine_dtype, find_engine

def _context_limit(folder: Path) -> int | None:
    cfg = read_config_json(folder)   # a broken config.json is one line naming it, not a silent None
    return (cfg.get("text_config") or cfg).get("max_position_embeddings")


def deployment_length(base_dir: Path, cand_dir: Path, max_len: int | None, source: str | None) -> tuple[int, str]:
    """The length the engine serves: ``max_len``, else the baseline's ``max_position_embeddings``;
    refused in one line when either model's config caps the context below it (the engine would
    refuse it or cut every prompt there)."""
    base_limit = _context_limit(base_dir)
    length = max_len if max_len is not None else base_limit
    if length is None:
        raise QuantkitError(f"--max-len: needed: {base_dir / 'config.json'} gives no max_position_embeddings")
    for who, folder in (("baseline", base_dir), ("candidate", cand_dir)):
        limit = _context_limit(folder)
        if limit is not None and length > limit:
            raise QuantkitError(f"{source or '--max-len'}: {length} exceeds the {who}'s max_position_embeddings "
                                f"({limit}, {folder / 'config.json'}): the engine cannot serve the deployment length")
    return length, source or "the baseline's max_position_embeddings"


@dataclass
class _Models:
    """What both ways in share: the tokenizer, the options, the candidate folder for the path agreement."""
    base_dir: Path
    cand_dir: Path
    tokenizer: object
    options: EngineOptions
    max_len: int
    max_len_source: str
    device: str = "cpu"
    record: dict = field(default_factory=dict)

    @property
    def baseline_folder(self) -> Path:
        return self.base_dir

    @property
    def max_window(self) -> int:
        return self.serve_len - 1

    @property
    def serve_len(self) -> int:
        """The servers' max_model_len: one more than the deployment length where both models allow
        it, so a window of the full length plus its one output token fits, as in quantkit's own path."""
        limits = [x for x in (_context_limit(self.base_dir), _context_limit(self.cand_dir)) if x]
        return self.max_len + 1 if all(x > self.max_len for x in limits) else self.max_len

    def path_check(self) -> PathCheck | None:
        if not self.options.path_tokens:
            return None
        return PathCheck(load_model(self.cand_dir, self.device), pad_id(self.tokenizer), self.options.path_tokens)

    @contextmanager
    def baseline(self) -> Iterator[ServedModel]:
        yield from self._open("baseline")

    @contextmanager
    def candidate(self) -> Iterator[ServedModel]:
        yield from self._open("candidate")

    def _open(self, who: str) -> Iterator[ServedModel]:
        raise NotImplementedError

    def not_measured(self) -> list[str]:
        return list(NOT_MEASURED) + ([] if self.options.path_tokens else ["path agreement (--path-tokens 0)"])

    def settings(self) -> dict:
        return {**self.record, "top_k": self.options.k,
                "kl": f"estimated from both models' top-{self.options.k} log-probabilities (topk.py)",
                "path_tokens": self.options.path_tokens}


@dataclass
class VllmModels(_Models):
    """Both models served by vLLM servers quantkit starts, one after the other."""
    engine: Engine | None = None
    dtype: str = "auto"
    _next: Server | None = None          # the candidate's server, started during the baseline's pass

    def _open(self, who: str) -> Iterator[ServedModel]:
        opts = ServeOptions(max_model_len=self.serve_len, dtype=self.dtype, max_logprobs=self.options.k,
                            startup_timeout_s=self.options.startup_timeout_s)
        if who == "baseline" and not self.engine.cuda:
            # on the CPU the candidate's server starts while the baseline is scored (it is scored only after:
            # the passes still take turns); on a GPU, where one model's server takes the memory, it waits
            self._next = Server(self.engine, self.cand_dir, opts)
        server = self._next if who == "candidate" and self._next else Server(
            self.engine, self.base_dir if who == "baseline" else self.cand_dir, opts)
        try:
            s = server.ready()
            self.record[who] = {**s.settings, "command": s.command}
            yield ServedModel(s.endpoint, self.tokenizer, self.options.k)
        except BaseException:
            server.stop()
            if self._next is not None and self._next is not server:   # the candidate's, started early
                self._next.stop()
            raise
        server.stop(clean=True)


@dataclass
class EndpointModels(_Models):
    """Both models on servers the user runs."""
    base_endpoint: Endpoint | None = None
    cand_endpoint: Endpoint | None = None

    @property
    def serve_len(self) -> int:
        return min((e.max_model_len for e in (self.base_endpoint, self.cand_endpoint) if e.max_model_len),
                   default=self.max_len + 1)

    def _open(self, who: str) -> Iterator[ServedModel]:
        ep = self.base_endpoint if who == "baseline" else self.cand_endpoint
        self.record[who] = {"engine": "endpoint", "url": ep.url, "model": ep.model, "version": ep.version(),
                            "max_model_len": ep.max_model_len}
        yield ServedModel(ep, self.tokenizer, self.options.k)



def served_models(options: EngineOptions, base_dir: Path, cand_dir: Path, tokenizer, max_len: int | None,
                  source: str | None, device: str = "cpu") -> _Models:
    """The two models as ``options`` serves them, checked before any server starts: the engine
    Python imports vLLM, the endpoints answer and serve the deployment length."""
    options.check()
    if options.engine:
        length, source = deployment_length(base_dir, cand_dir, max_len, source)
        engine = find_engine(options.python)
        return VllmModels(base_dir, cand_dir, tokenizer, options, length, source, device, engine=engine,
                          dtype=engine_dtype(engine, cand_dir, options.dtype))
    base = Endpoint.connect(options.baseline_endpoint, flag="--baseline-endpoint")
    cand = Endpoint.connect(options.endpoint, flag="--endpoint")
    served = min((e.max_model_len for e in (base, cand) if e.max_model_len), default=None)
    length = max_len if max_len is not None else served
    if length is None:
        raise QuantkitError("--max-len: needed: the servers do not say their max_model_len")
    for e in (base, cand):
        if e.max_model_len is not None and length > e.max_model_len:
            raise QuantkitError(f"{source or '--max-len'}: {length} exceeds {e.url}'s max_model_len "
                                f"({e.max_model_len}) ({e.flag})")
    return EndpointModels(base_dir, cand_dir, tokenizer, options, length,
                          source or "the servers' max_model_len", device, base_endpoint=base, cand_endpoint=cand)
