"""``quantkit eval --engine ENGINE`` / ``--endpoint``: the baseline and the candidate as served.

Two ways in: quantkit starts the engine's servers itself through the engine contract
(serving/contract.py: healthy or its own error line, stopped with every process it made), on
127.0.0.1 and a free port, both in the dtype the host's capabilities give the candidate; or the
user names two running OpenAI-compatible servers (``endpoint`` for the candidate,
``baseline_endpoint``). Either way each server answers a timed probe before any slice
(serving/probe.py), the models are scored by backends/served.py, and the candidate is also loaded
in this process for the path agreement (measures/path.py), unless ``path_tokens`` is 0.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from quantkit.errors import QuantkitError
from quantkit.evaluation.backends.served import ServedModel
from quantkit.evaluation.backends.served_forced import PathCheck
from quantkit.evaluation.checkpoint import load_model
from quantkit.evaluation.causal_lm import pad_id
from quantkit.serving.capabilities import DtypeChoice
from quantkit.serving.client import EngineError, Endpoint
from quantkit.serving.contract import Engine, EngineKind, ServeOptions, Server, failure_note
from quantkit.serving.deployment import checkpoint_format, context_limit, deployment_length, vocab_size
from quantkit.serving.engine_options import NOT_MEASURED, EngineOptions
from quantkit.serving.probe import TooSlow, timed_probe
from quantkit.serving.engines import engine_kind

SLOW_INSTEAD = ("evaluate it in quantkit's own path (leave out --engine), or serve a format this host runs fast "
                "(docs/engine.md, hosts and dtypes)")
SLOW_INSTEAD_ENDPOINT = "serve it on a faster host or in another format, or leave out --endpoint"


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
    def vocab(self) -> int | None:
        """The larger of both models' ``vocab_size`` (None when a config does not say)."""
        sizes = [vocab_size(d) for d in (self.base_dir, self.cand_dir)]
        return max(sizes) if all(sizes) else None

    @property
    def max_window(self) -> int:
        return self.serve_len - 1

    @property
    def serve_len(self) -> int:
        """The servers' max_model_len: one more than the deployment length where both models allow
        it, so a window of the full length plus its one output token fits, as in quantkit's own path."""
        limits = [x for x in (context_limit(self.base_dir), context_limit(self.cand_dir)) if x]
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
class StartedModels(_Models):
    """Both models served by servers quantkit starts with the engine ``kind``, in the dtype the
    host gives the candidate (``dtype``), each probed before its pass."""
    kind: EngineKind | None = None
    engine: Engine | None = None
    dtype: DtypeChoice | None = None
    _next: Server | None = None          # the candidate's server, started during the baseline's pass
    _probed: dict = field(default_factory=dict)   # who -> the probe's figures, taken once per server

    def _open(self, who: str) -> Iterator[ServedModel]:
        opts = ServeOptions(max_model_len=self.serve_len, dtype=self.dtype.dtype, dtype_reason=self.dtype.reason,
                            max_logprobs=self.options.k, startup_timeout_s=self.options.startup_timeout_s)
        if who == "baseline" and not self.engine.cuda:
            # on the CPU the candidate's server starts while the baseline is scored (it is scored only after:
            # the passes still take turns); on a GPU, where one model's server takes the memory, it waits
            self._next = self.kind.start(self.engine, self.cand_dir, opts)
        folder = self.base_dir if who == "baseline" else self.cand_dir
        server = self._next if who == "candidate" and self._next else self.kind.start(self.engine, folder, opts)
        try:
            s = server.ready()
            if who == "baseline" and self._next is not None:   # refused before the baseline's pass
                self._probed["candidate"] = self._probe("candidate", self._next.ready(), self.cand_dir)
            probe = self._probed.get(who) or self._probe(who, s, folder)
            self.record[who] = {**s.settings, "command": s.command, "probe": probe}
            yield ServedModel(s.endpoint, self.tokenizer, self.options.k, failure_note=lambda: failure_note(server),
                              vocab=self.vocab)
        except BaseException as e:
            server.stop()
            if self._next is not None and self._next is not server:   # the candidate's, started early
                self._next.stop()
            if isinstance(e, EngineError) and not isinstance(e, TooSlow) and "the engine's last error" not in str(e):
                raise EngineError(f"{e}{failure_note(server)}") from None
            raise
        server.stop(clean=True)

    def _probe(self, who: str, served, folder: Path) -> dict:
        fmt = checkpoint_format(folder) or "unquantized"
        what = (f"the {who} ({folder.name}, {fmt}) in {served.settings.get('dtype', self.dtype.dtype)} on "
                f"{self.engine.capabilities.describe()}")
        return timed_probe(served.endpoint, what, SLOW_INSTEAD).to_dict()


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
        probe = timed_probe(ep, f"the {who} at {ep.url} ({ep.model})", SLOW_INSTEAD_ENDPOINT).to_dict()
        self.record[who] = {"engine": "endpoint", "url": ep.url, "model": ep.model, "version": ep.version(),
                            "max_model_len": ep.max_model_len, "probe": probe}
        yield ServedModel(ep, self.tokenizer, self.options.k, vocab=self.vocab)



def served_models(options: EngineOptions, base_dir: Path, cand_dir: Path, tokenizer, max_len: int | None,
                  source: str | None, device: str = "cpu") -> _Models:
    """The two models as ``options`` serves them, checked before any server starts: the engine
    Python imports vLLM, the endpoints answer and serve the deployment length."""
    options.check()
    if options.engine:
        length, source = deployment_length(base_dir, cand_dir, max_len, source)
        kind = engine_kind(options.engine)
        engine = kind.find(options.python)
        # the baseline runs in the candidate's dtype: the comparison measures the quantization, not two dtypes
        return StartedModels(base_dir, cand_dir, tokenizer, options, length, source, device, kind=kind,
                             engine=engine, dtype=kind.dtype(engine, cand_dir, options.dtype))
    base = Endpoint.connect(options.baseline_endpoint, flag="--baseline-endpoint")
    cand = Endpoint.connect(options.endpoint, flag="--endpoint")
    if (base.url, base.model) == (cand.url, cand.model):
        raise QuantkitError(f"--baseline-endpoint: the same server and model as --endpoint ({cand.url}, {cand.model}): "
                            "the candidate would be compared with itself")
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
