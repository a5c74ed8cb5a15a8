"""``evaluate(baseline, candidate, tokenizer)``: every measure of every slice, the verdict,
and an ``EvalResult`` that saves report.md / report.html / report.json.
"""
from __future__ import annotations

import time
from contextlib import closing
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from tqdm.auto import tqdm

from quantkit.common import concurrency
from quantkit.errors import QuantkitError

from quantkit.evaluation.backends.base import ScoringBackend
from quantkit.evaluation.backends.in_process import InProcessBackend
from quantkit.evaluation.backends.served import SLICES_AT_ONCE, ServedModels, ServedPass
from quantkit.evaluation.business import BusinessRows, business_meta, read_business
from quantkit.evaluation.code_exec import using_runner
from quantkit.evaluation.context import Reach, plan_reach
from quantkit.evaluation.forced import View
from quantkit.evaluation.languages import LanguageGate, language_gate, model_folder
from quantkit.evaluation.sandbox import Runner, SandboxUnavailable, code_runner
from quantkit.evaluation.slices import Slice, SuiteOptions, load_suite
from quantkit.evaluation.verdict import GO, RANK, REVIEW, Thresholds, Verdict, decide, insufficient, within_noise
from quantkit.evaluation.lm_eval_bridge import compare_lm_eval, lm_eval_measures, task_manager
from quantkit.runtime.loader import model_fallbacks

from quantkit.evaluation.eval_result import EvalResult, flagged_measures
from quantkit.evaluation.slice_scoring import Measured, SliceRun, cap, measure_slice

if TYPE_CHECKING:
    from quantkit.evaluation.integrity import IntegrityReport



@dataclass
class EvalConfig:
    """What ``evaluate`` compares the models on and how (see ``evaluate`` for each field's meaning).

    Validated on construction; ``thresholds`` (a dict as a recipe's ``eval: thresholds:``) becomes a
    ``Thresholds``, ``options`` None the default ``SuiteOptions``.

    >>> EvalConfig(max_len=4096).thresholds.limits["kl_mean"].nogo
    0.1
    >>> EvalConfig(lm_eval_limit=0)
    Traceback (most recent call last):
    quantkit.errors.QuantkitError: evaluate: lm_eval_limit: expected a positive integer or None, got 0
    """
    suite: str | list[str] | list[Slice] = "default"
    max_len: int | None = None
    max_len_source: str | None = None      # where max_len came from, for the report
    thresholds: dict | Thresholds | None = None
    options: SuiteOptions | None = None
    calibration_log: str | Path | None = None
    calibration_sample: str | Path | None = None
    show_samples: bool = False
    footprint: dict | None = None
    module_errors: dict[str, float] | None = None
    progress: bool = True
    meta: dict | None = None
    languages: str | list[str] | LanguageGate | None = None
    lm_eval_tasks: list[str] | None = None
    lm_eval_limit: int | None = None
    integrity: IntegrityReport | None = None
    unsafe_code_exec: bool = False
    variants: Mapping[str, View] | None = None

    def __post_init__(self) -> None:
        for name in ("max_len", "lm_eval_limit"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise QuantkitError(f"evaluate: {name}: expected a positive integer or None, got {v!r}")
        if self.options is None:
            self.options = SuiteOptions()
        elif not isinstance(self.options, SuiteOptions):
            raise QuantkitError(f"evaluate: options: expected a SuiteOptions, got {type(self.options).__name__}")
        if not isinstance(self.thresholds, Thresholds):
            self.thresholds = Thresholds.from_dict(self.thresholds)


def evaluate(baseline, candidate, tokenizer, config: EvalConfig | None = None, **fields) -> EvalResult:
    """Compare ``candidate`` with ``baseline`` (both transformers causal LMs) on a suite, as
    ``config`` says (an ``EvalConfig``; keyword ``fields`` build one, or replace its fields).

    ``max_len`` is the deployment length (``max_len_source`` says where it came from, for the
    report); None: the baseline's ``max_position_embeddings``. The long-context slices run to it
    (context.py: a window the machine cannot afford is shortened, texts shorter than it leave
    positions unmeasured; both are warnings) and are gated on their deepest position bucket.
    ``variants`` (name -> ``with view(candidate) as model:``, e.g. the candidate with each KV-cache
    option, or without its own) are scored beside the candidate on the long slices: KL by
    position and their would-be level, shown in the report, never changing the decision.

    ``calibration_log`` (the user's traffic log) adds one private slice per task (business.py:
    through the chat template, scoring the assistant turns); the rows whose content is in
    ``calibration_sample`` (a sampler folder or its manifest.json) are left out, counted in
    ``meta.business``.

    ``languages`` (e.g. ``"en,zh"``) are the languages whose slices gate the decision; when
    None, the ``language:`` of the model card (README.md) in the folder the baseline was
    loaded from, else every language (see languages.py). ``lm_eval_tasks`` also runs those
    local lm-eval tasks on both models; their accuracy drop enters the verdict as
    ``lm_eval_acc_drop`` on a slice ``lm-eval:<task>``. ``integrity`` (an
    ``integrity.IntegrityReport`` of the candidate's files) adds each module or tensor it
    flags as a slice ``integrity:<name>`` that always gates.

    Code items (and lm-eval tasks that run code) run behind the bubblewrap sandbox
    (sandbox.py); where it cannot be set up they are skipped and ``warnings`` says so, unless
    ``unsafe_code_exec`` runs them without it. An evaluation that measured nothing on a slice
    that gates is REVIEW, never GO.

    The models are scored in this process (backends/in_process.py); the measures are the
    registered ones (measures/).

    >>> result = evaluate(base_model, quantkit.load("ckpt"), tok, max_len=4096)  # doctest: +SKIP
    >>> result.decision, result.save("ckpt/eval")                                # doctest: +SKIP
    ('GO', PosixPath('ckpt/eval'))
    """
    cfg = replace(config, **fields) if config is not None else EvalConfig(**fields)
    setup = _set_up(baseline, tokenizer, cfg)
    for m in (baseline, candidate):
        m.eval()
    setup.open_runner(cfg)
    t0, c0 = time.perf_counter(), time.process_time()
    suite = _score_suite(InProcessBackend(baseline, candidate, tokenizer), tokenizer, cfg, setup)
    lm, measures = _beside_the_suite(baseline, candidate, tokenizer, cfg, setup, suite)
    _warn_fallbacks(setup, baseline, candidate)
    verdict = _judge(measures, cfg, setup, suite)
    # CPU seconds beside wall seconds: on a shared machine the wall clock mostly measures the others
    suite.seconds_total, suite.cpu_total = time.perf_counter() - t0, time.process_time() - c0
    return _result(cfg, setup, suite, verdict, lm_eval=lm, variants=suite.by_variant)


def evaluate_served(served: ServedModels, tokenizer, config: EvalConfig | None = None, **fields) -> EvalResult:
    """``evaluate`` with both models behind a server (backends/served.py), scored in turn: the
    baseline's pass, then the candidate's, each inside ``served``'s context for it (quantkit's own
    vLLM server, started and stopped there, or the user's endpoint).

    The deployment length is ``config.max_len`` (``served.max_len`` when None); windows hold at
    most ``served.max_window`` tokens (a served prompt plus one output token must fit the server's
    ``max_model_len``: one token less than the deployment length when the model allows no more). What a server cannot give (views of the candidate, lm-eval tasks) is
    refused, and ``served.not_measured()`` is listed in the report."""
    cfg = replace(config, **fields) if config is not None else EvalConfig(**fields)
    if cfg.variants:
        raise QuantkitError("--kv: KV-cache options are applied in quantkit's own path only, not in the engine")
    if cfg.lm_eval_tasks:
        raise QuantkitError("--lm-eval: lm-eval tasks run in quantkit's own path only, not in the engine")
    length = cfg.max_len or served.max_len
    reach = Reach(length, cfg.max_len_source or served.max_len_source, min(length, served.max_window), 0.0, 0.0,
                  limited_by="engine")
    setup = _set_up_slices(reach, served.baseline_folder, tokenizer, cfg)
    setup.open_runner(cfg)
    t0, c0 = time.perf_counter(), time.process_time()
    record: dict = {}
    with served.baseline() as base, closing(base):   # its figures pair the baseline with itself: only the record is kept
        _score_suite(ServedPass(base, record, replay=False), tokenizer, cfg,
                     replace(setup, warnings=[], reach=replace(reach, slices={})), desc="engine: baseline",
                     at_once=SLICES_AT_ONCE)
    with served.candidate() as cand, closing(cand):
        path = served.path_check()   # the candidate in this process, beside the engine
        suite = _score_suite(ServedPass(cand, record, replay=True, path=path), tokenizer, cfg, setup,
                             desc="engine: candidate", at_once=SLICES_AT_ONCE)
    measures = dict(suite.values)
    if cfg.integrity is not None:
        measures.update(flagged_measures(cfg.integrity, cfg.thresholds))
    if path is not None:
        _warn_fallbacks(setup, path.model)
    verdict = _judge(measures, cfg, setup, suite)
    suite.seconds_total, suite.cpu_total = time.perf_counter() - t0, time.process_time() - c0
    return _result(cfg, setup, suite, verdict, engine={**served.settings(), "not_measured": served.not_measured()})


@dataclass
class _Setup:
    """What ``evaluate`` resolves before scoring anything."""
    reach: Reach
    slices: list[Slice]
    business: BusinessRows | None
    gate: LanguageGate
    runner: Runner | None = None
    code_meta: dict | None = None
    warnings: list[str] = field(default_factory=list)

    def open_runner(self, cfg: EvalConfig) -> None:
        """The code runner, then the warnings of what the suite will not see as asked."""
        self.runner, self.code_meta, self.warnings = open_code_runner(self.slices, cfg.options, cfg.unsafe_code_exec,
                                                                      bool(cfg.lm_eval_tasks))
        if self.business is not None and cfg.calibration_sample is None:
            self.warnings.append("business slices not checked against the calibration sample (--calib-sample): "
                                 "rows the candidate was calibrated on may be among them")
        if self.reach.window < self.reach.max_len and any(s.long_context for s in self.slices):
            self.warnings.append(self.reach.notes()[0])


def _set_up(baseline, tokenizer, cfg: EvalConfig) -> _Setup:
    """The deployment length and the window it affords, the slices, the languages that gate; an
    unknown lm-eval task fails here, not after the suite."""
    limit = getattr(getattr(baseline, "config", None), "max_position_embeddings", None)
    if limit and cfg.max_len is not None and cfg.max_len > limit:
        raise QuantkitError(f"{cfg.max_len_source or '--max-len'}: {cfg.max_len} exceeds the model's "
                            f"max_position_embeddings ({limit})")
    return _set_up_slices(plan_reach(baseline, cfg.max_len, cfg.max_len_source), model_folder(baseline),
                          tokenizer, cfg)


def _set_up_slices(reach: Reach, folder, tokenizer, cfg: EvalConfig) -> _Setup:
    suite = cfg.suite
    slices = suite if suite and isinstance(suite, list) and isinstance(suite[0], Slice) else load_suite(suite)
    business = None
    if cfg.calibration_log:
        business = read_business(cfg.calibration_log, tokenizer, cfg.options.business_rows, cfg.calibration_sample)
        slices = slices + business.slices
    gate = language_gate(cfg.languages, None if cfg.languages else folder)
    if cfg.lm_eval_tasks:
        task_manager(list(cfg.lm_eval_tasks))
    return _Setup(reach, slices, business, gate)


@dataclass
class _Suite:
    """Every slice's results, and how long each took."""
    values: dict = field(default_factory=dict)
    buckets: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)
    by_variant: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)
    seconds_total: float = 0.0
    cpu_total: float = 0.0


def _score_suite(backend: ScoringBackend, tokenizer, cfg: EvalConfig, setup: _Setup, desc: str = "eval",
                 at_once: int = 1) -> _Suite:
    """Every slice measured through ``backend``, ``at_once`` slices at a time (a served backend:
    see ``SLICES_AT_ONCE``); results are kept in the suite's order either way."""
    run = SliceRun(tokenizer, min(setup.reach.max_len, setup.reach.window), cfg.options, cfg.show_samples, setup.runner, setup.reach,
                    cfg.variants or {})
    out = _Suite()
    with tqdm(total=len(setup.slices) * 2, desc=desc, disable=not cfg.progress, unit="step") as bar:
        served = getattr(backend, "model", None)
        if served is not None and hasattr(served, "on_answer"):   # a served pass: the bar moves with each answer
            served.on_answer = lambda n: bar.set_postfix_str(f"{n} requests answered", refresh=n % 16 == 0)
        for sl, (got, seconds, cpu) in zip(setup.slices, _measured(setup.slices, backend, run, bar, at_once)):
            out.values[sl.name], out.examples[sl.name] = got.values, got.examples
            setup.warnings += got.warnings
            if got.buckets:
                out.buckets[sl.name] = got.buckets
            if got.variants:
                out.by_variant[sl.name] = got.variants
            out.seconds[sl.name] = seconds
            if cpu is not None:
                out.cpu[sl.name] = cpu
    return out


def _measured(slices: list[Slice], backend: ScoringBackend, run: SliceRun, bar,
              at_once: int) -> list[tuple[Measured, float, float | None]]:
    """Per slice, in order: what it gave, its wall seconds and its CPU seconds. Slices measured
    together overlap in time and share this process's CPU: their CPU seconds are not told apart."""
    def timed(sl: Slice) -> tuple[Measured, float, float | None]:
        ts, cs = time.perf_counter(), time.process_time()
        if at_once == 1:
            bar.set_postfix_str(sl.name)
        got = measure_slice(sl, backend, run, bar, at_once)
        bar.update(1)
        return got, time.perf_counter() - ts, time.process_time() - cs if at_once == 1 else None

    return concurrency.at_once([partial(timed, sl) for sl in slices], at_once, "quantkit-slice")


def _beside_the_suite(baseline, candidate, tokenizer, cfg: EvalConfig, setup: _Setup,
                      suite: _Suite) -> tuple[dict, dict[str, dict]]:
    """The lm-eval tasks' results, and every pseudo-slice the verdict reads beside the suite's:
    ``lm-eval:<task>`` and the flagged ``integrity:<name>``."""
    lm, measures = {}, dict(suite.values)
    if cfg.lm_eval_tasks:
        ts, cs = time.perf_counter(), time.process_time()
        with using_runner(setup.runner):
            lm = compare_lm_eval(baseline, candidate, tokenizer, list(cfg.lm_eval_tasks), limit=cfg.lm_eval_limit)
        measures.update(lm_eval_measures(lm))
        suite.seconds["lm-eval"], suite.cpu["lm-eval"] = time.perf_counter() - ts, time.process_time() - cs
    if cfg.integrity is not None:
        measures.update(flagged_measures(cfg.integrity, cfg.thresholds))
    return lm, measures


def _warn_fallbacks(setup: _Setup, *models) -> None:
    """The slower kernels the scored models ran (e.g. CUDA ran the torch reference: slower than deployed)."""
    for m in models:
        setup.warnings += [r for r in model_fallbacks(m) if r not in setup.warnings]


def _judge(measures: dict[str, dict], cfg: EvalConfig, setup: _Setup, suite: _Suite) -> Verdict:
    """The verdict, the warnings it raises, and the worst examples and variant levels it selects."""
    th = cfg.thresholds
    thin = insufficient(measures, [s.name for s in setup.slices if not s.public], cfg.options.business_scored_tokens)
    verdict = decide(measures, th, {s.name: setup.gate.why_not() for s in setup.slices
                                    if not setup.gate.gates(s.language, s.public)}, thin)
    if not any(v for s, v in measures.items() if s not in verdict.not_gated):
        setup.warnings.append("nothing was measured on a slice that gates the verdict: REVIEW, not GO")
        verdict = replace(verdict, decision=max(verdict.decision, REVIEW, key=RANK.get))
    verdict = replace(verdict, noise=within_noise(measures, th))
    suite.examples = {k: v for k, v in suite.examples.items() if verdict.slices.get(k) != GO and v}
    for name, vs in suite.by_variant.items():   # each variant's would-be level on the slice: information
        for variant in vs.values():
            variant["level"] = decide({name: variant}, th).slices[name]
    return verdict


def _result(cfg: EvalConfig, setup: _Setup, suite: _Suite, verdict: Verdict, **measured) -> EvalResult:
    """The result of a scored suite; ``measured``: what one path adds (lm-eval tasks and KV
    variants in process, the servers' settings in an engine)."""
    return EvalResult(meta=_meta(cfg, setup, suite), slices=suite.values, buckets=suite.buckets,
                      examples=suite.examples, verdict=verdict, thresholds=cfg.thresholds, footprint=cfg.footprint,
                      module_errors=cfg.module_errors, public={s.name: s.public for s in setup.slices},
                      languages={s.name: s.language for s in setup.slices}, gate=setup.gate,
                      integrity=None if cfg.integrity is None else cfg.integrity.to_dict(), warnings=setup.warnings,
                      **measured)


def _meta(cfg: EvalConfig, setup: _Setup, suite: _Suite) -> dict:
    reach = setup.reach
    return {"max_len": reach.max_len, "max_len_source": reach.source, "long_context": reach.to_dict(),
            "long_context_notes": reach.notes(), "suite": [s.name for s in setup.slices],
            "show_samples": cfg.show_samples, "seconds_total": suite.seconds_total,
            "seconds_per_slice": suite.seconds, "cpu_seconds_total": suite.cpu_total,
            "cpu_seconds_per_slice": suite.cpu, "languages": setup.gate.to_dict(),
            **({"code_exec": setup.code_meta} if setup.code_meta else {}),
            **({"business": business_meta(setup.business.summary, suite.values, cfg.options.business_scored_tokens)}
               if setup.business else {}),
            **(cfg.meta or {})}


def open_code_runner(slices: list[Slice], opt: SuiteOptions, unsafe: bool,
                     lm_eval: bool) -> tuple[Runner | None, dict | None, list[str]]:
    """What will run the suite's code: the sandbox, the unsafe path when asked, or nothing
    (the code items are skipped), with what the report records about it and its warnings."""
    counts = {s.name: n for s in slices if (n := len(cap(s.of_kind("code"), opt.code_items)))}
    if not counts and not lm_eval:
        return None, None, []
    if unsafe:
        return (code_runner(unsafe=True), {"runner": "unsandboxed (unsafe_code_exec)"},
                ["--unsafe-code-exec: code ran WITHOUT a sandbox, able to read, write and reach "
                 "whatever quantkit's user can"])
    try:
        return code_runner(), {"runner": "bubblewrap sandbox"}, []
    except SandboxUnavailable as e:
        info = {"runner": None, "reason": str(e), "skipped": counts}
        if not counts:   # lm-eval only: a task that runs code fails with this reason when it does
            return None, info, []
        skipped = ", ".join(f"{name} ({n})" for name, n in counts.items())
        return None, info, [f"code items skipped, not measured: {skipped}: no sandbox for generated code "
                            f"({e}); --unsafe-code-exec runs them without one"]


