"""``quantkit loadtest``: the served checkpoint under the shape of the user's traffic, ramped to
its capacity knee (loadtest/: the length model, the requests, the ramp policy, the report).

One ramp per model: the candidate, and with ``baseline`` the baseline first, with the very same
requests (one seeded stream each), so the report can state the speedup at equal SLO. A model is
served by vLLM, started here with the launch config of the memory account (loadtest/launch_config.py),
or by the user's endpoint. Requests go to 127.0.0.1 or to that endpoint only; every step is
bounded in requests and time; every server is stopped on every way out.

A ramp that ends early (the server died, Ctrl-C, SIGTERM, an error) still writes the steps it
completed, marked incomplete, and the command fails.
"""
from __future__ import annotations

import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from quantkit.common.outputs import OutputPolicy, existing_path
from quantkit.errors import QuantkitError
from quantkit.loadtest import loadtest_report as report
from quantkit.loadtest.generator import run_step
from quantkit.evaluation.checkpoint import load_tokenizer, resolve_dir
from quantkit.loadtest.launch_config import launch_for
from quantkit.loadtest.traffic import read_traffic
from quantkit.loadtest.lengths import fit_lognormal, length_summary, percentile
from quantkit.loadtest.ramp import RampPolicy, find_knee, recommended, step_summary, stop_reason
from quantkit.loadtest.requests import LengthModel, LoadRequest, RequestStream, prompt_ids
from quantkit.loadtest.slo import SLO
from quantkit.serving.client import Endpoint, EngineError
from quantkit.serving.contract import ServeOptions, serve
from quantkit.serving.deployment import checkpoint_format, deployment_length
from quantkit.serving.probe import timed_probe
from quantkit.serving.processes import guarded
from quantkit.serving.engines import engine_kind

#: one step: (requests, concurrency, timeout) -> (per-request timings, wall seconds, tool name)
StepRunner = Callable[[list[LoadRequest], int, float], tuple[list[dict], float, str]]
#: told when a step starts (its summary None) and when it ends (its summary)
Progress = Callable[["Ramp", int, "dict | None"], None]


def _quiet(ramp: "Ramp", concurrency: int, step: dict | None) -> None:
    pass


CPU_KV_CACHE_GIB = 4
SLOW_INSTEAD = ("load-test a format this host runs fast (docs/engine.md, hosts and dtypes), or serve it on a GPU and "
                "name it with --endpoint")
SLOW_INSTEAD_ENDPOINT = "serve it on a faster host or in another format"


@dataclass(frozen=True)
class LoadtestOptions:
    """What ``quantkit loadtest`` was asked."""
    model: str | None                 # the checkpoint (or model) to serve; its tokenizer renders the traffic
    traffic: Path
    slo: SLO
    out: Path
    engine: str | None = None         # a registered engine (serving/engines.py): quantkit starts the servers
    engine_python: Path | None = None
    endpoint: str | None = None       # the user's server for the model
    baseline: str | None = None       # a second model, ramped with the same requests
    baseline_endpoint: str | None = None
    policy: RampPolicy = field(default_factory=RampPolicy)
    max_model_len: int | None = None
    gpu_mem: str = "80GiB"
    seed: int = 0
    overwrite: bool = False


@dataclass
class Ramp:
    """One model's ramp: its steps, why it stopped, whether it ran to a stop of its own."""
    role: str
    steps: list[dict] = field(default_factory=list)
    stopped: str | None = None
    complete: bool = False
    engine: dict = field(default_factory=dict)
    tool: str | None = None
    sent: dict = field(default_factory=lambda: {"prompt": [], "output": []})   # tokens, as the server counted

    def to_dict(self) -> dict:
        knee = find_knee(self.steps)
        return {"role": self.role, "complete": self.complete, "stopped": self.stopped, "steps": self.steps,
                "knee": knee, "recommended_concurrency": recommended(knee) if knee else None,
                "best_goodput_rps": max((s["goodput_rps"] for s in self.steps), default=None),
                "engine": self.engine, "tool": self.tool,
                "sent": {k: sent_quantiles(v) for k, v in self.sent.items()}}


def sent_quantiles(lengths: list[int]) -> dict | None:
    """P50 / P90 / P99 of the lengths the server counted for the requests it completed."""
    if not lengths:
        return None
    return {"n": len(lengths), **{f"p{round(q * 100)}": percentile(lengths, q) for q in (0.5, 0.9, 0.99)}}


def measured_timings(timings: list[dict], warmup: int) -> tuple[list[dict], float | None]:
    """The requests a step's figures come from (after the warm-up wave) and the seconds they span
    (first start to last end: ``end``, else ``start`` + ``e2e``), when every one carries them;
    else None."""
    kept = timings[warmup:]
    spans = [(t["start"], t.get("end", t["start"] + (t.get("e2e") or 0.0))) for t in kept if t.get("start") is not None]
    if not kept or len(spans) < len(kept):
        return kept, None
    return kept, max(e for _, e in spans) - min(s for s, _ in spans)


def run_ramp(ramp: Ramp, runner: StepRunner, stream: RequestStream, policy: RampPolicy, slo: SLO,
             progress: Progress = _quiet) -> Ramp:
    """Climb the concurrency steps until ``stop_reason`` says stop or the time is spent; each step
    appended as it completes (an exception leaves the ones before it in ``ramp``)."""
    deadline = time.monotonic() + policy.max_seconds
    for c in policy.concurrencies():
        left = deadline - time.monotonic()
        if left <= 0:
            ramp.stopped = f"--max-minutes spent before concurrency {c}"
            break
        # the measured requests carry the same lengths at every step; the warm-up wave the ones after
        n = policy.measured(c)
        drawn = stream.take(n + c)
        requests = drawn[n:] + drawn[:n]
        progress(ramp, c, None)
        try:
            timings, seconds, ramp.tool = runner(requests, c, left)
        except TimeoutError:
            ramp.stopped = f"--max-minutes spent during concurrency {c} (that step is not counted)"
            break
        kept, span = measured_timings(timings, c)
        for t in timings:
            if t.get("ok"):
                ramp.sent["prompt"].append(t.get("prompt_tokens") or 0)
                ramp.sent["output"].append(t.get("output_tokens") or 0)
        ramp.steps.append(step_summary(c, kept, span if span else seconds, slo))
        progress(ramp, c, ramp.steps[-1])
        ramp.stopped = stop_reason(ramp.steps, policy, slo)
        if ramp.stopped:
            break
    ramp.complete = True
    return ramp


def length_model(traffic, max_model_len: int) -> tuple[LengthModel, dict]:
    """The fitted length model and what the report shows of it."""
    pfit = fit_lognormal(traffic.prompt_tokens, "prompt lengths")
    ofit = fit_lognormal(traffic.output_tokens, "output lengths")
    report = {}
    for name, xs, fit in (("prompt", traffic.prompt_tokens, pfit), ("output", traffic.output_tokens, ofit)):
        report[name] = {**length_summary(xs, fit), "curve": quantile_curve(xs, fit)}
    return LengthModel(pfit, ofit, max_model_len), report


def quantile_curve(lengths: list[int], fit) -> dict:
    """Empirical and fitted lengths at a grid of quantiles: the report's length plot."""
    qs = [i / 20 for i in range(1, 20)] + [0.99]
    return {"q": qs, "empirical": [percentile(lengths, q) for q in qs], "fitted": [fit.quantile(q) for q in qs]}


@contextmanager
def served_target(opts: LoadtestOptions, role: str, model_dir: Path | None, endpoint: str | None,
                  max_model_len: int, dtype_from: Path | None = None) -> Iterator[tuple[Endpoint, dict]]:
    """The endpoint a ramp runs against and what is known of its engine: the user's, or a server
    started with the launch config (stopped when the block is left, however) in the dtype the host
    gives ``dtype_from`` (the candidate: both ramps run one dtype). Either is probed, timed, first."""
    flag = "--baseline-endpoint" if role == "baseline" else "--endpoint"
    if endpoint is not None:
        ep = Endpoint.connect(endpoint, flag=flag)
        probe = timed_probe(ep, f"the {role} at {ep.url} ({ep.model})", SLOW_INSTEAD_ENDPOINT)
        yield ep, {"endpoint": ep.url, "model": ep.model, "max_model_len": ep.max_model_len, "probe": probe.to_dict()}
        return
    kind = engine_kind(opts.engine)
    engine = kind.find(opts.engine_python)
    choice = kind.dtype(engine, dtype_from or model_dir)
    launch = launch_for(model_dir, max_model_len, cuda=engine.cuda, dtype=choice.dtype, gpu_mem=opts.gpu_mem,
                        cpu_kv_cache_gib=CPU_KV_CACHE_GIB, kind=kind)
    # the folder is removed even if this process is killed outright (guarded)
    with tempfile.TemporaryDirectory(prefix="quantkit-launch-") as tmp, guarded(Path(tmp)):
        # the server reads the emitted file itself: the load test runs the config a user would deploy
        config = launch.write(Path(tmp) / "launch.yaml")
        serve_opts = ServeOptions(max_model_len=max_model_len, dtype=choice.dtype, dtype_reason=choice.reason,
                                  cpu_kv_cache_gib=CPU_KV_CACHE_GIB, extra_args=("--config", str(config)))
        with serve(kind, engine, model_dir, serve_opts) as served:
            what = (f"the {role} ({model_dir.name}, {checkpoint_format(model_dir) or 'unquantized'}) in "
                    f"{served.settings.get('dtype', choice.dtype)} on {engine.capabilities.describe()}")
            probe = timed_probe(served.endpoint, what, SLOW_INSTEAD)
            info = {**served.settings, "command": served.command, "launch_config": launch.config,
                    "predicted_concurrency": launch.predicted_concurrency, "probe": probe.to_dict()}
            yield served.endpoint, info


def check_targets(opts: LoadtestOptions) -> None:
    """The flags that name where the load goes, checked before anything starts."""
    if (opts.engine is None) == (opts.endpoint is None):
        raise QuantkitError("--engine / --endpoint: name exactly one: --engine vllm (quantkit starts the server) "
                            "or --endpoint URL (a server you run)")
    if opts.engine is not None:
        engine_kind(opts.engine)
    if opts.baseline_endpoint is not None and opts.endpoint is None:
        raise QuantkitError("--baseline-endpoint: goes with --endpoint; with --engine vllm name --baseline MODEL")
    if opts.endpoint is not None and opts.baseline is not None:
        raise QuantkitError("--baseline: with --endpoint, name the baseline's server with --baseline-endpoint URL")


def ramp_error(e: BaseException) -> str:
    """The one line a ramp that ended early records."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    if isinstance(e, EngineError):
        return f"the server failed: {e}"
    return f"{type(e).__name__}: {e}"


def speedup(base: dict, cand: dict) -> dict | None:
    """The candidate against the baseline at equal SLO: best goodput, and output throughput at
    each one's knee (or its last step when it has none)."""
    if not base["steps"] or not cand["steps"]:
        return None

    def at_knee(r: dict) -> float:
        step = next((s for s in r["steps"] if s["concurrency"] == r["knee"]), r["steps"][-1])
        return step["output_tokens_per_s"]

    out = {"output_tokens_per_s_at_knee": _ratio(at_knee(cand), at_knee(base))}
    out["goodput"] = _ratio(cand["best_goodput_rps"], base["best_goodput_rps"])
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _targets(opts: LoadtestOptions, model_dir: Path, base_dir: Path | None) -> list[tuple[str, Path | None, str | None]]:
    out = []
    if base_dir is not None or opts.baseline_endpoint is not None:
        out.append(("baseline", base_dir, opts.baseline_endpoint))
    return out + [("candidate", model_dir, opts.endpoint)]


def loadtest(opts: LoadtestOptions, runner_for: Callable[[Endpoint, Path], StepRunner],
             progress: Progress = _quiet) -> dict:
    """Ramp every target (``_targets``) and return the report's data; on any way out of a ramp
    the data so far is kept in ``partial`` (the caller writes it) before the exception goes on."""
    check_targets(opts)
    model_dir = resolve_dir(opts.model)
    base_dir = resolve_dir(opts.baseline) if opts.baseline is not None else None
    tok = load_tokenizer(model_dir)
    traffic = read_traffic(opts.traffic, tok)
    max_len, _ = deployment_length(base_dir or model_dir, model_dir, opts.max_model_len, "--max-model-len")
    lengths, length_report = length_model(traffic, max_len)
    rows = prompt_ids(traffic.prompts, tok)
    data = {"kind": "quantkit-loadtest", "complete": False, "slo": opts.slo.to_dict(), "lengths": length_report,
            "traffic": {"log": str(opts.traffic), "rows": traffic.rows, "malformed": traffic.malformed,
                        "without_prompt": traffic.without_prompt, "with_reply": len(traffic.output_tokens)},
            "policy": {**vars(opts.policy)}, "max_model_len": max_len, "seed": opts.seed, "ramps": []}
    try:
        for role, target_dir, endpoint in _targets(opts, model_dir, base_dir):
            ramp = Ramp(role)
            data["ramps"].append(ramp)
            with served_target(opts, role, target_dir, endpoint, max_len, dtype_from=model_dir) as (ep, info):
                ramp.engine = info
                # a server that serves less context than the model's: requests that fit it
                served_len = min(max_len, ep.max_model_len or max_len)
                stream = RequestStream(rows, replace(lengths, max_model_len=served_len), opts.seed, tok)
                run_ramp(ramp, runner_for(ep, model_dir), stream, opts.policy, opts.slo, progress)
            ramp.engine["too_long_for_context"] = stream.too_long
            ramp.engine["windows_moved_no_clean_cut"] = stream.no_clean_cut
    except BaseException as e:
        if data["ramps"] and not data["ramps"][-1].complete:
            data["ramps"][-1].stopped = ramp_error(e)
        raise LoadtestInterrupted(report_data(data), e) from e
    data["complete"] = True
    return report_data(data)


def report_data(data: dict) -> dict:
    data = {**data, "ramps": [r.to_dict() if isinstance(r, Ramp) else r for r in data["ramps"]]}
    by_role = {r["role"]: r for r in data["ramps"]}
    data["speedup"] = (speedup(by_role["baseline"], by_role["candidate"])
                       if {"baseline", "candidate"} <= set(by_role) else None)
    cand = by_role.get("candidate") or {}
    for key in ("steps", "knee", "recommended_concurrency", "engine"):
        data[key] = cand.get(key)
    return data


class LoadtestInterrupted(Exception):
    """A ramp ended early: ``data`` holds the steps completed, for a report marked incomplete."""

    def __init__(self, data: dict, cause: BaseException) -> None:
        super().__init__(ramp_error(cause))
        self.data, self.cause = data, cause
        self.written: Path | None = None     # the incomplete report, once written


def loadtest_to_folder(opts: LoadtestOptions, lang: str, progress: Progress = _quiet) -> tuple[dict, Path]:
    """``quantkit loadtest`` whole: the ramps run from a work folder removed however the run ends
    (even killed outright: ``guarded``), the report written to ``opts.out`` in ``lang``. A ramp
    that ends early raises ``LoadtestInterrupted`` with ``written`` set to its incomplete report
    (None when no step completed)."""
    policy = OutputPolicy("loadtest", {"traffic log": existing_path(opts.traffic), "model": existing_path(opts.model),
                                       "baseline model": existing_path(opts.baseline)})
    policy.check(opts.out, opts.overwrite)
    with tempfile.TemporaryDirectory(prefix="quantkit-loadtest-") as workdir, guarded(Path(workdir)):
        try:
            data = loadtest(opts, step_runner(Path(workdir), opts.engine_python), progress)
        except LoadtestInterrupted as e:
            if any(r["steps"] for r in e.data["ramps"]):
                e.written = report.save(e.data, opts.out, policy, opts.overwrite, lang)
            raise
    return data, report.save(data, opts.out, policy, opts.overwrite, lang)


def step_runner(workdir: Path, python: Path | None = None):
    """The load generator behind each step (loadtest/generator.py), for one endpoint; run from
    ``python`` (``--engine-python``: with ``--endpoint`` too, the generator is vLLM's)."""
    def runner_for(ep, model_dir):
        def run(requests, concurrency, left):
            r = run_step(ep.url, ep.model, requests, concurrency, timeout_s=left, workdir=workdir,
                         tokenizer_dir=model_dir, python=python)
            return r.timings, r.seconds, r.tool
        return run
    return runner_for

