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

from quantkit.evaluation.bootstrap import prompt_intervals, row_intervals
from quantkit.evaluation.backends.base import CodeRequest, Continuation, ScoredSlice, ScoringBackend
from quantkit.evaluation.backends.in_process import InProcessBackend
from quantkit.evaluation.backends.served import SLICES_AT_ONCE, ServedModels, ServedPass
from quantkit.evaluation.business import BusinessRows, business_meta, read_business
from quantkit.evaluation.code_exec import using_runner
from quantkit.evaluation.context import Reach, plan_reach
from quantkit.evaluation.forced import ForcedRequest, View, encode_text
from quantkit.evaluation.generation import prefix_agreement
from quantkit.evaluation.labels import LABEL_GEN_TOKENS, LABEL_ROWS, label_runs
from quantkit.evaluation.languages import LanguageGate, language_gate, model_folder
from quantkit.evaluation.measures import measure_values
from quantkit.evaluation.measures.labels import label_probabilities, labelled
from quantkit.evaluation.sandbox import Runner, SandboxUnavailable, code_runner
from quantkit.evaluation.slices import Slice, SuiteOptions, load_suite
from quantkit.evaluation.tasks import mc_summary
from quantkit.evaluation.verdict import GO, RANK, REVIEW, Thresholds, Verdict, decide, insufficient, within_noise
from quantkit.evaluation.report import save, to_json
from quantkit.evaluation.lm_eval_bridge import compare_lm_eval, lm_eval_measures, task_manager
from quantkit.evaluation.text_window import context, token_text
from quantkit.runtime.loader import model_fallbacks

if TYPE_CHECKING:
    from quantkit.evaluation.integrity import IntegrityReport

HIDDEN = "[business text hidden: pass --show-samples to include it]"
# generation prompts per text: its openings of 1, 2 and 3 times SuiteOptions.prompt_tokens. A slice
# holds a dozen texts or more, and greedy agreement over 8 prompts moved by 0.1 between two runs of
# equally good 8-bit kernels (docs/evaluate.md, "Greedy agreement")
GEN_OPENINGS = 3


@dataclass
class EvalResult:
    """Everything a report shows. ``to_json()`` is the single source of the numbers."""
    meta: dict
    slices: dict[str, dict]                      # slice -> measure -> value
    buckets: dict[str, list[dict]]               # long slices: KL by position bucket
    examples: dict[str, list[dict]]              # worst examples of the slices that are not GO
    verdict: Verdict
    thresholds: Thresholds
    footprint: dict | None = None
    module_errors: dict[str, float] | None = None
    public: dict[str, bool] = field(default_factory=dict)
    languages: dict[str, str | None] = field(default_factory=dict)   # slice -> language
    gate: LanguageGate = field(default_factory=LanguageGate)
    lm_eval: dict[str, dict] = field(default_factory=dict)            # task -> metric -> base/cand/drop
    integrity: dict | None = None                                     # integrity.IntegrityReport.to_dict()
    warnings: list[str] = field(default_factory=list)                 # what was not measured, and why
    # long slices: variant of the candidate (e.g. a KV-cache option) -> its KL by position and level
    variants: dict[str, dict[str, dict]] = field(default_factory=dict)
    # scored inside a serving engine: each server's settings, the KL estimator, what it did not measure
    engine: dict | None = None

    @property
    def decision(self) -> str:
        return self.verdict.decision

    def to_json(self) -> dict:
        return to_json(self)

    def save(self, out_dir: str | Path, overwrite: bool = False, policy=None, lang: str = "en") -> Path:
        """Write report.json, report.md and report.html into ``out_dir`` (atomically); an existing
        report folder is replaced only with ``overwrite`` (``quantkit.common.outputs``). ``lang``
        ("en" or "zh") is the language of report.md and report.html; report.json is the same in both."""
        return save(self, Path(out_dir), policy, overwrite, lang)


def _worst_text_examples(sl: Slice, encoded, forced, tokenizer, show: bool, k: int = 3) -> list[dict]:
    ranked = sorted(zip(encoded, forced.items), key=lambda p: -(p[1].kl_sum / max(p[1].tokens, 1)))[:k]
    out = []
    for e, st in ranked:
        if st.worst_pos < 0:
            continue
        ex = {"id": e.item_id, "kl_mean": st.kl_sum / max(st.tokens, 1), "worst_token_kl": st.worst_kl,
              "position": st.worst_pos}
        if sl.public or show:
            ex["context"] = context(tokenizer.decode, e.ids, max(0, st.worst_pos - 24), st.worst_pos)
            ex["token"] = token_text(tokenizer.decode, e.ids, st.worst_pos)
        else:
            ex["context"] = HIDDEN
        out.append(ex)
    return out


def cap(xs: list, n: int | None) -> list:
    return xs[:n] if n is not None else xs


def _scored_budget(items: list[dict], encoded, budget: int | None):
    """The first rows whose scored tokens reach ``budget`` (all of them when None or short of it)."""
    if budget is None:
        return items, encoded
    total = 0
    for k, e in enumerate(encoded):
        total += sum(e.scored[1:]) if e.scored is not None else len(e.ids) - 1  # token 0 is never predicted
        if total >= budget:
            return items[:k + 1], encoded[:k + 1]
    return items, encoded


def _generation_prompts(tokenizer, items: list[dict], encoded, prompt_tokens: int, limit: int) -> list[list[int]]:
    """Texts' openings of ``prompt_tokens``, then of twice and three times as many (the first
    opening of every text comes first); a business row's own prompt (what its reply is generated
    from, through the chat template: business.py), its last ``limit`` tokens."""
    rows, openings = [], [[] for _ in range(GEN_OPENINGS)]
    for it, e in zip(items, encoded):
        if it.get("gen_prompt"):
            ids = encode_text(tokenizer, {"id": "", "text": it["gen_prompt"]}, 10**9).ids[-limit:]
            if len(ids) >= 8:
                rows.append(ids)
            continue
        for j, out in enumerate(openings):
            if len(e.ids) >= (j + 1) * prompt_tokens + 8:
                out.append(e.ids[:(j + 1) * prompt_tokens])
    return rows + [p for out in openings for p in out]


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


@dataclass
class _Measured:
    """What one slice gave: its measures, KL by position, worst examples, the variants' results."""
    values: dict = field(default_factory=dict)
    buckets: list = field(default_factory=list)
    examples: list = field(default_factory=list)
    variants: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)


@dataclass(frozen=True)
class _SliceRun:
    """What every slice is measured with."""
    tokenizer: object
    max_len: int
    options: SuiteOptions
    show: bool
    runner: Runner | None
    reach: Reach
    variants: Mapping[str, View]


def _measure_slice(sl: Slice, backend: ScoringBackend, run: _SliceRun, bar, at_once: int = 1) -> _Measured:
    """Score ``sl`` through ``backend``: the figures each part gives, then every registered measure.
    With ``at_once`` > 1 its texts and its tasks (independent calls) are scored at the same time."""
    out, tasks, scored = _Measured(), _Measured(), ScoredSlice()

    def texts() -> None:
        scored_texts = _score_texts(sl, backend, run, scored, out)
        if sl.label_replies:
            _score_labels(scored_texts, sl.label_replies, backend, run, scored, out)
        bar.update(1)

    # the calls still running after an error end with their server (ServedModel.close)
    concurrency.at_once([texts, lambda: _score_tasks(sl, backend, run, scored, tasks)], at_once, "quantkit-slice")
    out.values.update(tasks.values)
    out.examples += tasks.examples
    out.values.update(measure_values(scored))
    out.values.update(prompt_intervals(scored))
    return out


def _score_texts(sl: Slice, backend: ScoringBackend, run: _SliceRun, scored: ScoredSlice,
                 out: _Measured) -> list[dict]:
    """The teacher-forced pass and greedy generation over the slice's texts; the texts scored."""
    opt, tokenizer = run.options, run.tokenizer
    texts = cap(sl.of_kind("text"), opt.text_items if sl.public else opt.business_rows)
    if not texts:
        return []
    window = run.reach.window if sl.long_context else run.max_len
    limit = window if sl.long_context else min(opt.item_tokens if sl.public else opt.business_tokens, run.max_len)
    encoded = [encode_text(tokenizer, it, limit) for it in texts]
    if not sl.public:
        texts, encoded = _scored_budget(texts, encoded, opt.business_scored_tokens)
        out.values.update(rows=len(texts), rows_without_reply=sum(not it.get("reply", True) for it in texts))
    request = ForcedRequest(window, opt.batch_tokens, bucket_positions=sl.long_context)
    scored.forced = forced = backend.teacher_forced(encoded, request, run.variants if sl.long_context else None)
    out.values.update(forced.figures())
    if not sl.public:   # business slices: how far their measures could move with other rows
        out.values.update(row_intervals(forced.items))
    out.buckets, out.variants = forced.buckets, forced.views
    if sl.long_context:
        full = [len(tokenizer(it["text"], add_special_tokens=True)["input_ids"]) for it in texts]
        out.warnings += run.reach.record(sl.name, full, forced.deepest)
    out.examples += _worst_text_examples(sl, encoded, forced, tokenizer, run.show)
    if not sl.long_context and opt.gen_prompts:
        prompts = _generation_prompts(tokenizer, texts, encoded, opt.prompt_tokens,
                                      min(limit, opt.business_prompt_tokens))
        scored.generations = backend.continuations(prompts[:opt.gen_prompts], opt.gen_tokens, opt.gen_batch)
        out.examples += _worst_generation(sl, scored.generations, tokenizer, run.show)
    return texts


def _score_labels(texts: list[dict], labels: tuple[str, ...], backend: ScoringBackend, run: _SliceRun,
                  scored: ScoredSlice, out: _Measured) -> None:
    """A label slice's rows (labels.py), from their own prompts: both models' greedy replies and
    their probabilities of the baseline's."""
    opt, tokenizer = run.options, run.tokenizer
    limit = min(opt.business_prompt_tokens, run.max_len - LABEL_GEN_TOKENS)
    prompts = [p for it in texts if it.get("gen_prompt")
               for p in [encode_text(tokenizer, {"id": "", "text": it["gen_prompt"]}, 10**9).ids[-limit:]] if p]
    prompts = prompts[:LABEL_ROWS]
    if not prompts:
        return
    scored.labels = label_runs(backend, prompts, tokenizer.decode, labels, tokenizer.eos_token_id,
                               ForcedRequest(run.max_len, opt.batch_tokens), opt.gen_batch)
    pb, pc = label_probabilities(scored)
    out.values.update(label_rows=len(labelled(scored)), label_prob_base=pb, label_prob_cand=pc)


def _worst_generation(sl: Slice, generations: list[Continuation], tokenizer, show: bool) -> list[dict]:
    """The prompt whose continuations agree least, unless every one agrees to the end."""
    if not generations:
        return []
    agreement, worst = min(((prefix_agreement(c.base, c.cand, c.n_tokens), c) for c in generations),
                           key=lambda p: p[0])
    if agreement >= 1.0:
        return []
    # a reply cut after N tokens may end inside a character: whole characters only
    shown = ({k: context(tokenizer.decode, ids, 0, len(ids))
              for k, ids in (("prompt", worst.prompt), ("baseline", worst.base), ("candidate", worst.cand))}
             if sl.public or show else {"prompt": HIDDEN})
    return [{"id": "generation", "agreement": agreement, **shown}]


def _score_tasks(sl: Slice, backend: ScoringBackend, run: _SliceRun, scored: ScoredSlice, out: _Measured) -> None:
    opt = run.options
    mcs = cap(sl.of_kind("mc"), opt.mc_items)
    if mcs:
        scored.choices = c = backend.multiple_choice(mcs)
        out.values.update(mc_summary(mcs, c.base, c.cand))
    ext = cap(sl.of_kind("extract"), opt.extract_items)
    if ext:
        scored.extraction = r = backend.extraction(ext, opt.extract_tokens, opt.gen_batch)
        fb, fc = r.means("f1")
        out.values.update({"extract_items": len(ext), "extract_f1_base": fb, "extract_f1_cand": fc})
        lost = sorted(zip(ext, r.base, r.cand), key=lambda t: t[2]["f1"] - t[1]["f1"])[:2]
        out.examples += [{"id": it["id"], "f1_base": a["f1"], "f1_cand": b["f1"],
                          **({"prompt": it["prompt"], "baseline": a["output"], "candidate": b["output"]}
                             if sl.public or run.show else {"prompt": HIDDEN})}
                         for it, a, b in lost if b["f1"] < a["f1"]]
    code = cap(sl.of_kind("code"), opt.code_items)
    if code and run.runner is not None:   # without a runner the caller records why they were skipped
        scored.code = r = backend.code(code, CodeRequest(opt.code_tokens, opt.gen_batch, opt.code_timeout_s,
                                                         run.runner))
        pb, pc = r.means("passed")
        out.values.update({"code_problems": len(code), "code_pass_base": pb, "code_pass_cand": pc})
        out.examples += [{"id": a["id"], "baseline_status": a["status"], "candidate_status": b["status"],
                          "candidate": b["completion"]} for a, b in zip(r.base, r.cand)
                         if a["passed"] and not b["passed"]][:2]


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
    return EvalResult(_meta(cfg, setup, suite), suite.values, suite.buckets, suite.examples, verdict, cfg.thresholds,
                      cfg.footprint, cfg.module_errors, {s.name: s.public for s in setup.slices},
                      {s.name: s.language for s in setup.slices}, setup.gate, lm,
                      None if cfg.integrity is None else cfg.integrity.to_dict(), setup.warnings, suite.by_variant)


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
    return EvalResult(_meta(cfg, setup, suite), suite.values, suite.buckets, suite.examples, verdict, cfg.thresholds,
                      cfg.footprint, cfg.module_errors, {s.name: s.public for s in setup.slices},
                      {s.name: s.language for s in setup.slices}, setup.gate, {},
                      None if cfg.integrity is None else cfg.integrity.to_dict(), setup.warnings, {},
                      engine={**served.settings(), "not_measured": served.not_measured()})


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
    run = _SliceRun(tokenizer, min(setup.reach.max_len, setup.reach.window), cfg.options, cfg.show_samples, setup.runner, setup.reach,
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


def _measured(slices: list[Slice], backend: ScoringBackend, run: _SliceRun, bar,
              at_once: int) -> list[tuple[_Measured, float, float | None]]:
    """Per slice, in order: what it gave, its wall seconds and its CPU seconds. Slices measured
    together overlap in time and share this process's CPU: their CPU seconds are not told apart."""
    def timed(sl: Slice) -> tuple[_Measured, float, float | None]:
        ts, cs = time.perf_counter(), time.process_time()
        if at_once == 1:
            bar.set_postfix_str(sl.name)
        got = _measure_slice(sl, backend, run, bar, at_once)
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


def flagged_measures(integrity, thresholds: Thresholds) -> dict[str, dict]:
    """The integrity measures of the modules and tensors past a limit (the others stay out of the verdict)."""
    return {name: values for name, values in integrity.measures().items()
            if any(lim.level(values[m]) != GO for m, lim in thresholds.for_slice(name).items() if m in values)}


def integrity_only(integrity, thresholds: dict | Thresholds | None = None, meta: dict | None = None) -> EvalResult:
    """The result for a checkpoint that cannot be served (a tensor missing, a wrong shape or dtype):
    the integrity findings alone decide; no slice is measured."""
    th = thresholds if isinstance(thresholds, Thresholds) else Thresholds.from_dict(thresholds)
    verdict = decide(flagged_measures(integrity, th), th)
    info = {"max_len": None, "suite": [], "seconds_total": integrity.seconds,
            "slices_skipped": "the checkpoint cannot be served (see integrity): no slice was measured", **(meta or {})}
    return EvalResult(info, {}, {}, {}, verdict, th, integrity=integrity.to_dict())
