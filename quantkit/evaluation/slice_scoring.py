"""One slice scored on one backend: texts (teacher-forced measures, worst examples), labels, tasks
and generations, each against its scored-token budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from quantkit.common import concurrency
from quantkit.evaluation.backends.base import CodeRequest, Continuation, ScoredSlice, ScoringBackend
from quantkit.evaluation.bootstrap import prompt_intervals, row_intervals
from quantkit.evaluation.context import Reach
from quantkit.evaluation.forced import ForcedRequest, View, encode_text
from quantkit.evaluation.greedy_agreement import prefix_agreement
from quantkit.evaluation.label_tasks import LABEL_GEN_TOKENS, LABEL_ROWS, label_runs
from quantkit.evaluation.measures import measure_values
from quantkit.evaluation.measures.labels import label_probabilities, labelled
from quantkit.evaluation.sandbox import Runner
from quantkit.evaluation.slices import Slice, SuiteOptions
from quantkit.evaluation.task_metrics import mc_summary
from quantkit.evaluation.text_window import context, token_text

HIDDEN = "[business text hidden: pass --show-samples to include it]"
# generation prompts per text: its openings of 1, 2 and 3 times SuiteOptions.prompt_tokens. A slice
# holds a dozen texts or more, and greedy agreement over 8 prompts moved by 0.1 between two runs of
# equally good 8-bit kernels (docs/evaluate.md, "Greedy agreement")
GEN_OPENINGS = 3


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


def scored_budget(items: list[dict], encoded, budget: int | None):
    """The first rows whose scored tokens reach ``budget`` (all of them when None or short of it)."""
    if budget is None:
        return items, encoded
    total = 0
    for k, e in enumerate(encoded):
        total += sum(e.scored[1:]) if e.scored is not None else len(e.ids) - 1  # token 0 is never predicted
        if total >= budget:
            return items[:k + 1], encoded[:k + 1]
    return items, encoded


def generation_prompts(tokenizer, items: list[dict], encoded, prompt_tokens: int, limit: int) -> list[list[int]]:
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
class Measured:
    """What one slice gave: its measures, KL by position, worst examples, the variants' results."""
    values: dict = field(default_factory=dict)
    buckets: list = field(default_factory=list)
    examples: list = field(default_factory=list)
    variants: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)


@dataclass(frozen=True)
class SliceRun:
    """What every slice is measured with."""
    tokenizer: object
    max_len: int
    options: SuiteOptions
    show: bool
    runner: Runner | None
    reach: Reach
    variants: Mapping[str, View]


def measure_slice(sl: Slice, backend: ScoringBackend, run: SliceRun, bar, at_once: int = 1) -> Measured:
    """Score ``sl`` through ``backend``: the figures each part gives, then every registered measure.
    With ``at_once`` > 1 its texts and its tasks (independent calls) are scored at the same time."""
    out, tasks, scored = Measured(), Measured(), ScoredSlice()

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


def _score_texts(sl: Slice, backend: ScoringBackend, run: SliceRun, scored: ScoredSlice,
                 out: Measured) -> list[dict]:
    """The teacher-forced pass and greedy generation over the slice's texts; the texts scored."""
    opt, tokenizer = run.options, run.tokenizer
    texts = cap(sl.of_kind("text"), opt.text_items if sl.public else opt.business_rows)
    if not texts:
        return []
    window = run.reach.window if sl.long_context else run.max_len
    limit = window if sl.long_context else min(opt.item_tokens if sl.public else opt.business_tokens, run.max_len)
    encoded = [encode_text(tokenizer, it, limit) for it in texts]
    if not sl.public:
        texts, encoded = scored_budget(texts, encoded, opt.business_scored_tokens)
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
        prompts = generation_prompts(tokenizer, texts, encoded, opt.prompt_tokens,
                                      min(limit, opt.business_prompt_tokens))
        scored.generations = backend.continuations(prompts[:opt.gen_prompts], opt.gen_tokens, opt.gen_batch)
        out.examples += _worst_generation(sl, scored.generations, tokenizer, run.show)
    return texts


def _score_labels(texts: list[dict], labels: tuple[str, ...], backend: ScoringBackend, run: SliceRun,
                  scored: ScoredSlice, out: Measured) -> None:
    """A label slice's rows (label_tasks.py), from their own prompts: both models' greedy replies and
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


def _score_tasks(sl: Slice, backend: ScoringBackend, run: SliceRun, scored: ScoredSlice, out: Measured) -> None:
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
