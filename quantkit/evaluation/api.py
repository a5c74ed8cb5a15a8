"""``evaluate(baseline, candidate, tokenizer)``: every measure of every slice, the verdict,
and an ``EvalResult`` that saves report.md / report.html / report.json.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from tqdm.auto import tqdm

from ..errors import QuantkitError
from ..kernels import backend_fallbacks

from .bootstrap import row_intervals
from .business import business_meta, read_business
from .code_exec import using_runner
from .context import Reach, plan_reach
from .forced import View, encode_text, run_forced
from .generation import generation_agreement
from .languages import LanguageGate, language_gate, model_folder
from .models import pad_id
from .pair import both
from .sandbox import Runner, SandboxUnavailable, code_runner
from .slices import Slice, SuiteOptions, load_suite
from .tasks import CodeExecution, code_pass, extraction, mc_summary, multiple_choice
from .verdict import GO, RANK, REVIEW, Thresholds, Verdict, decide, within_noise

HIDDEN = "[business text hidden: pass --show-samples to include it]"


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

    @property
    def decision(self) -> str:
        return self.verdict.decision

    def to_json(self) -> dict:
        from .report import to_json
        return to_json(self)

    def save(self, out_dir: str | Path, overwrite: bool = False, policy=None) -> Path:
        """Write report.json, report.md and report.html into ``out_dir`` (atomically); an existing
        report folder is replaced only with ``overwrite`` (``quantkit.outputs``)."""
        from .report import save
        return save(self, Path(out_dir), policy, overwrite)


def _worst_text_examples(sl: Slice, encoded, forced, tokenizer, show: bool, k: int = 3) -> list[dict]:
    ranked = sorted(zip(encoded, forced.items), key=lambda p: -(p[1].kl_sum / max(p[1].tokens, 1)))[:k]
    out = []
    for e, st in ranked:
        if st.worst_pos < 0:
            continue
        ex = {"id": e.item_id, "kl_mean": st.kl_sum / max(st.tokens, 1), "worst_token_kl": st.worst_kl,
              "position": st.worst_pos}
        if sl.public or show:
            ex["context"] = tokenizer.decode(e.ids[max(0, st.worst_pos - 24):st.worst_pos])
            ex["token"] = tokenizer.decode(e.ids[st.worst_pos:st.worst_pos + 1])
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
    """A text's opening; a business row's own prompt (what its reply is generated from, through
    the chat template: business.py), its last ``limit`` tokens."""
    out = []
    for it, e in zip(items, encoded):
        if it.get("gen_prompt"):
            ids = encode_text(tokenizer, {"id": "", "text": it["gen_prompt"]}, 10**9).ids[-limit:]
            if len(ids) >= 8:
                out.append(ids)
        elif len(e.ids) >= prompt_tokens + 8:
            out.append(e.ids[:prompt_tokens])
    return out


@dataclass
class _Measured:
    """What one slice gave: its measures, KL by position, worst examples, the variants' results."""
    values: dict = field(default_factory=dict)
    buckets: list = field(default_factory=list)
    examples: list = field(default_factory=list)
    variants: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)


def _measure_slice(sl: Slice, base, cand, tokenizer, max_len: int, opt: SuiteOptions, show: bool, bar,
                   runner: Runner | None, reach: Reach, variants: Mapping[str, View]) -> _Measured:
    pad, eos = pad_id(tokenizer), tokenizer.eos_token_id
    out = _Measured()
    values, examples = out.values, out.examples
    texts = cap(sl.of_kind("text"), opt.text_items if sl.public else opt.business_rows)
    if texts:
        window = reach.window if sl.long_context else max_len
        limit = window if sl.long_context else min(opt.item_tokens if sl.public else opt.business_tokens, max_len)
        encoded = [encode_text(tokenizer, it, limit) for it in texts]
        if not sl.public:
            texts, encoded = _scored_budget(texts, encoded, opt.business_scored_tokens)
            values.update(rows=len(texts), rows_without_reply=sum(not it.get("reply", True) for it in texts))
        forced = run_forced(base, cand, encoded, window, pad, opt.batch_tokens, bucket_positions=sl.long_context,
                            views=variants if sl.long_context else None)
        values.update(forced.summary())
        if not sl.public:   # business slices: how far their measures could move with other rows
            values.update(row_intervals(forced.items))
        out.buckets = forced.buckets
        out.variants = forced.views
        if sl.long_context:
            full = [len(tokenizer(it["text"], add_special_tokens=True)["input_ids"]) for it in texts]
            out.warnings += reach.record(sl.name, full, forced.deepest)
        examples += _worst_text_examples(sl, encoded, forced, tokenizer, show)
        if not sl.long_context and opt.gen_prompts:
            prompts = _generation_prompts(tokenizer, texts, encoded, opt.prompt_tokens,
                                          min(limit, opt.business_prompt_tokens))
            gen = generation_agreement(base, cand, prompts[:opt.gen_prompts], opt.gen_tokens, pad, eos, opt.gen_batch)
            if gen["gen_agreement"] is not None:
                values["gen_agreement"] = gen["gen_agreement"]
                worst = min(gen["examples"], key=lambda x: x["agreement"])
                if worst["agreement"] < 1.0:
                    examples.append({"id": "generation", "agreement": worst["agreement"],
                                     **({"prompt": tokenizer.decode(worst["prompt"]),
                                         "baseline": tokenizer.decode(worst["base"]),
                                         "candidate": tokenizer.decode(worst["cand"])}
                                        if sl.public or show else {"prompt": HIDDEN})})
    bar.update(1)
    mcs = cap(sl.of_kind("mc"), opt.mc_items)
    if mcs:
        s = mc_summary(mcs, *both(lambda m: multiple_choice(m, tokenizer, mcs, pad), base, cand))
        s["mc_accuracy_drop"] = s["mc_accuracy_base"] - s["mc_accuracy_cand"]
        values.update(s)
    ext = cap(sl.of_kind("extract"), opt.extract_items)
    if ext:
        rb, rc = both(lambda m: extraction(m, tokenizer, ext, opt.extract_tokens, pad, eos, opt.gen_batch), base, cand)
        fb, fc = (sum(r["f1"] for r in rs) / len(rs) for rs in (rb, rc))
        values.update({"extract_items": len(ext), "extract_f1_base": fb, "extract_f1_cand": fc,
                       "extract_f1_drop": fb - fc})
        lost = sorted(zip(ext, rb, rc), key=lambda t: t[2]["f1"] - t[1]["f1"])[:2]
        examples += [{"id": it["id"], "f1_base": a["f1"], "f1_cand": b["f1"],
                      **({"prompt": it["prompt"], "baseline": a["output"], "candidate": b["output"]}
                         if sl.public or show else {"prompt": HIDDEN})}
                     for it, a, b in lost if b["f1"] < a["f1"]]
    code = cap(sl.of_kind("code"), opt.code_items)
    if code and runner is not None:   # without a runner the caller records why they were skipped
        rb, rc = both(lambda m: code_pass(m, tokenizer, code, opt.code_tokens, pad, eos, opt.gen_batch,
                                          CodeExecution(runner, opt.code_timeout_s)), base, cand)
        pb, pc = (sum(r["passed"] for r in rs) / len(rs) for rs in (rb, rc))
        values.update({"code_problems": len(code), "code_pass_base": pb, "code_pass_cand": pc,
                       "code_pass_drop": pb - pc})
        examples += [{"id": a["id"], "baseline_status": a["status"], "candidate_status": b["status"],
                      "candidate": b["completion"]} for a, b in zip(rb, rc) if a["passed"] and not b["passed"]][:2]
    return out


def evaluate(baseline, candidate, tokenizer, suite: str | list[str] | list[Slice] = "default",
             max_len: int | None = None, thresholds: dict | Thresholds | None = None,
             options: SuiteOptions | None = None, calibration_log: str | Path | None = None,
             show_samples: bool = False, footprint: dict | None = None,
             module_errors: dict[str, float] | None = None, progress: bool = True,
             meta: dict | None = None, languages: str | list[str] | LanguageGate | None = None,
             lm_eval_tasks: list[str] | None = None, lm_eval_limit: int | None = None,
             integrity=None, unsafe_code_exec: bool = False, variants: Mapping[str, View] | None = None,
             max_len_source: str | None = None, calibration_sample: str | Path | None = None) -> EvalResult:
    """Compare ``candidate`` with ``baseline`` (both transformers causal LMs) on a suite.

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

    >>> result = evaluate(base_model, quantkit.load("ckpt"), tok, max_len=4096)  # doctest: +SKIP
    >>> result.decision, result.save("ckpt/eval")                                # doctest: +SKIP
    ('GO', PosixPath('ckpt/eval'))
    """
    opt = options or SuiteOptions()
    limit = getattr(getattr(baseline, "config", None), "max_position_embeddings", None)
    if limit and max_len is not None and max_len > limit:
        raise QuantkitError(f"{max_len_source or '--max-len'}: {max_len} exceeds the model's "
                            f"max_position_embeddings ({limit})")
    reach = plan_reach(baseline, max_len, max_len_source)
    max_len = reach.max_len
    th = thresholds if isinstance(thresholds, Thresholds) else Thresholds.from_dict(thresholds)
    slices = suite if suite and isinstance(suite, list) and isinstance(suite[0], Slice) else load_suite(suite)
    business = None
    if calibration_log:
        business = read_business(calibration_log, tokenizer, opt.business_rows, calibration_sample)
        slices = slices + business.slices
    gate = language_gate(languages, None if languages else model_folder(baseline))
    if lm_eval_tasks:
        from .lm_eval_bridge import task_manager
        task_manager(list(lm_eval_tasks))  # an unknown task fails now, not after the suite
    for m in (baseline, candidate):
        m.eval()
    runner, code_meta, warnings = open_code_runner(slices, opt, unsafe_code_exec, bool(lm_eval_tasks))
    if business is not None and calibration_sample is None:
        warnings.append("business slices not checked against the calibration sample (--calib-sample): "
                        "rows the candidate was calibrated on may be among them")
    if reach.window < reach.max_len and any(s.long_context for s in slices):
        warnings.append(reach.notes()[0])
    t0, c0 = time.perf_counter(), time.process_time()
    values, buckets, examples, seconds, cpu, by_variant = {}, {}, {}, {}, {}, {}
    with tqdm(total=len(slices) * 2, desc="eval", disable=not progress, unit="step") as bar:
        for sl in slices:
            bar.set_postfix_str(sl.name)
            ts, cs = time.perf_counter(), time.process_time()
            got = _measure_slice(sl, baseline, candidate, tokenizer, max_len, opt, show_samples, bar, runner,
                                 reach, variants or {})
            values[sl.name], examples[sl.name] = got.values, got.examples
            warnings += got.warnings
            if got.buckets:
                buckets[sl.name] = got.buckets
            if got.variants:
                by_variant[sl.name] = got.variants
            seconds[sl.name] = time.perf_counter() - ts
            cpu[sl.name] = time.process_time() - cs
            bar.update(1)
    lm = {}
    measures = dict(values)
    if lm_eval_tasks:
        from .lm_eval_bridge import compare_lm_eval, lm_eval_measures
        ts, cs = time.perf_counter(), time.process_time()
        with using_runner(runner):
            lm = compare_lm_eval(baseline, candidate, tokenizer, list(lm_eval_tasks), limit=lm_eval_limit)
        measures.update(lm_eval_measures(lm))
        seconds["lm-eval"], cpu["lm-eval"] = time.perf_counter() - ts, time.process_time() - cs
    if integrity is not None:
        measures.update(flagged_measures(integrity, th))
    langs = {s.name: s.language for s in slices}
    verdict = decide(measures, th, {s.name: gate.why_not() for s in slices
                                    if not gate.gates(s.language, s.public)})
    warnings += backend_fallbacks()   # e.g. CUDA ran the torch reference: slower than deployed
    if not any(v for s, v in measures.items() if s not in verdict.not_gated):
        warnings.append("nothing was measured on a slice that gates the verdict: REVIEW, not GO")
        verdict = replace(verdict, decision=max(verdict.decision, REVIEW, key=RANK.get))
    verdict = replace(verdict, noise=within_noise(measures, th))
    examples = {k: v for k, v in examples.items() if verdict.slices.get(k) != GO and v}
    for name, vs in by_variant.items():   # each variant's would-be level on the slice: information
        for variant in vs.values():
            variant["level"] = decide({name: variant}, th).slices[name]
    # CPU seconds beside wall seconds: on a shared machine the wall clock mostly measures the others
    info = {"max_len": max_len, "max_len_source": reach.source, "long_context": reach.to_dict(),
            "long_context_notes": reach.notes(), "suite": [s.name for s in slices], "show_samples": show_samples,
            "seconds_total": time.perf_counter() - t0, "seconds_per_slice": seconds,
            "cpu_seconds_total": time.process_time() - c0, "cpu_seconds_per_slice": cpu,
            "languages": gate.to_dict(), **({"code_exec": code_meta} if code_meta else {}),
            **({"business": business_meta(business.summary, values)} if business else {}), **(meta or {})}
    return EvalResult(info, values, buckets, examples, verdict, th, footprint, module_errors,
                      {s.name: s.public for s in slices}, langs, gate, lm,
                      None if integrity is None else integrity.to_dict(), warnings, by_variant)


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
